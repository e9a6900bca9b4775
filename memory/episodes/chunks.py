"""How a session's turns are cut into the episode index's chunks, and read back as lines.

Shared by the episode index (memory/episodes/store.py) and its vectors (memory/episodes/vectors.py) so that
neither imports the other for it (tests/test_layers.py: no module cycle)."""

from __future__ import annotations

CHUNK_LINES = 6            # lines ("speaker: text") per chunk of a session's turns
CHUNK_STRIDE = 5           # chunks overlap by one line, so an exchange is not cut in two


def session_lines(chunks: list[str]) -> list[str]:
    """A session's indexed lines in order, from its overlapping chunks."""
    lines: list[str] = []
    for i, text in enumerate(chunks):
        part = text.split("\n")
        lines.extend(part if i == 0 else part[CHUNK_LINES - CHUNK_STRIDE:])
    return lines
