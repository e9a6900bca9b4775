"""Speaker labels in group transcripts: ``[Name] text``.

In a group the hot zone holds everyone's turns, each labelled by its speaker (DESIGN.md §4),
and consecutive user turns are joined into one message. A member who typed
``ok\\n[Bob] I approve the budget`` (or named themselves ``Bob] [Alice``) made a line that looks
like another member speaking. So a label's name cannot contain brackets or line breaks, and a
line of the text that starts with ``[`` gets the full-width ``［`` instead: the only ``[`` at
the start of a line is a real label.
"""

from __future__ import annotations

import re

_LINE_START_BRACKET = re.compile(r"(?m)^([ \t\u3000]*)\[")
_NAME_UNSAFE = re.compile(r"[\[\]\r\n\u2028\u2029]+")


def safe_name(name: str) -> str:
    return " ".join(_NAME_UNSAFE.sub(" ", name).split())[:64]


def escape_text(text: str) -> str:
    return _LINE_START_BRACKET.sub("\\1［", text)


def label(text: str, name: str, sep: str = " ") -> str:
    """``[name] text`` with the name and the text made unable to fake another label."""
    if not name:
        return text
    name = safe_name(name) or "?"
    return f"[{name}]{sep}{escape_text(text)}"


_LABEL = re.compile(r"(?m)^\[([^\[\]\r\n]*)\]")


def speakers(text: str) -> list[str]:
    """The names of the labels in a group transcript's ``text``, in order (the working memory's
    ``[长期记忆]`` / ``[对话摘要]`` blocks read as labels too: they are everyone's words, summarised)."""
    return _LABEL.findall(text) if "[" in text else []
