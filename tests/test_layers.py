"""Who may import whom (DESIGN.md §2, issue 18): read from the source, so a new import that
breaks a seam fails here rather than in review.

- The handler, the commands, the neutral message and the reply interface know no transport:
  nothing from ``bot/lark/`` or the composition root ``bot/app.py``.
- The interfaces that are peers of Lark (console playground, terminal chat, ``/chat``) do not
  reach into Lark's package either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRANSPORT_NEUTRAL = ["bot/handler.py", "bot/lifecycle.py", "bot/commands.py", "bot/inbound.py", "bot/reply.py", "bot/delivery/direct.py",
                     "bot/text.py", "bot/terminal.py", "bot/web/playground.py", "bot/web/chat.py",
                     "bot/web/api.py", "bot/web/data.py"]


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("rel", TRANSPORT_NEUTRAL)
def test_transport_neutral_modules_do_not_import_lark_or_the_app(rel):
    bad = {m for m in imports(ROOT / rel) if m == "bot.lark" or m.startswith("bot.lark.") or m == "lark_oapi"
           or m.startswith("lark_oapi.")}
    if rel != "bot/terminal.py":          # the terminal starts the app; nothing else may
        bad |= {m for m in imports(ROOT / rel) if m == "bot.app"}
    assert not bad, f"{rel} imports {sorted(bad)}"

