"""Small text helpers every interface shares (commands, terminal, CLI, console, offline model)."""

from __future__ import annotations

import re
import time
import unicodedata
from typing import Any, Callable

_CJK = re.compile(r"[\u3400-\u9fff\u3040-\u30ff\uac00-\ud7af]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
SURROGATE = re.compile(r"[\ud800-\udfff]")   # lone surrogates cannot be stored as UTF-8


def clean_text(text: str) -> str:
    """What a user typed, fit to store and to show the model: NFC, no control characters."""
    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub("", text)
    text = SURROGATE.sub("\ufffd", text)
    return text.strip()


def is_chinese(text: str) -> bool:
    """Any CJK character: answers (apologies, commands) are then Chinese."""
    return bool(_CJK.search(text or ""))


def short(text: str, n: int) -> str:
    """One line of at most ``n`` characters: whitespace runs become one space, cut with "…"."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def when(ts: Any, fmt: str = "%Y-%m-%d %H:%M", *, empty: str = "") -> str:
    """A local time for people; ``empty`` when there is none (or it is no time)."""
    if not ts:
        return empty
    try:
        return time.strftime(fmt, time.localtime(float(ts)))
    except (TypeError, ValueError, OverflowError):
        return empty


def ambiguous_session(ref: str, error: Any, *, head: str | None = None,
                      more: Callable[[int], str] | None = None, title_chars: int = 40,
                      time_format: str = "%Y-%m-%d %H:%M", empty_time: str = "") -> str:
    """What to say to ``AmbiguousSession`` (the CLI, the terminal, ``/resume``): which ids
    match. ``head``/``more`` replace the CLI's English lines (``/resume`` answers in Chinese)."""
    lines = [head if head is not None else f"ethan: {ref!r} matches {error.total} sessions; type more of the id:"]
    lines += [f"  {c.id}  {when(c.updated_at, time_format, empty=empty_time)}  {short(c.title, title_chars)}"
              for c in error.candidates]
    hidden = error.total - len(error.candidates)
    if hidden > 0:
        lines.append(more(hidden) if more is not None else f"  … and {hidden} more")
    return "\n".join(lines)
