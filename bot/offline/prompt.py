"""Reading an offline-model request: the text of content blocks, the system prompt's sections
(memory facts, rules, profile name, recalled episodes), group speakers' labels, and the user's
own words in the last turn. Apart from the rules (``bot/offline/rules.py``) because it is how
Ethan's prompt is laid out, not what the offline model answers with it.
"""

from __future__ import annotations

import html
import re
from typing import Any

MAX_LINE_CHARS = 80


# --------------------------------------------------------------------------------------
# Reading the request
# --------------------------------------------------------------------------------------

def _text_of(content: Any) -> str:
    """The text of a message's content (a string, or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return ""


def _blocks(content: Any, kind: str) -> list[dict]:
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


def system_text(system: Any) -> str:
    return _text_of(system) if not isinstance(system, dict) else _text_of([system])


def _section(system: str, tag: str) -> list[str]:
    """The lines inside ``<tag>…</tag>`` (stored text is escaped, so it cannot close the tag)."""
    m = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", system, re.DOTALL)
    if not m:
        return []
    return [line for line in m.group(1).splitlines() if line.strip()]


_FACT_LINE = re.compile(r"^-\s*\[(\w+)\]\s*(.*?)(?:\s*\(confidence [\d.]+\))?\s*$")


def memory_facts(system: str) -> list[str]:
    out = []
    for line in _section(system, "memory_context"):
        m = _FACT_LINE.match(line)
        out.append(html.unescape(m.group(2) if m else line.lstrip("- ")))
    return [f for f in out if f]


def memory_rules(system: str) -> list[str]:
    return [html.unescape(line.strip().removeprefix("- ").strip()) for line in _section(system, "behavioral_guidelines")]


def profile_name(system: str) -> str:
    for line in _section(system, "user_profile"):
        m = re.search(r"(?:名字|姓名|称呼|name)\s*[:：是]\s*([^\s，。,;；]{1,30})", html.unescape(line), re.I)
        if m:
            return m.group(1)
    return ""


def memory_episodes(system: str) -> list[str]:
    out = []
    for line in _section(system, "related_episodes"):
        text = re.sub(r"\s*\(keywords: .*\)\s*$", "", line.strip().removeprefix("- "))
        out.append(html.unescape(text))
    return out


def _label_split(text: str) -> tuple[str, str]:
    """Group turns arrive as "[Name] text": (name, text)."""
    m = re.match(r"^\[([^\]\n]{1,64})\]\s(.*)$", text, re.DOTALL)
    return (m.group(1), m.group(2)) if m else ("", text)


def _clip(text: str, limit: int = MAX_LINE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=[.])\s")


def first_sentence(text: str, limit: int = MAX_LINE_CHARS) -> str:
    text = " ".join((text or "").split())
    for part in _SENTENCE_END.split(text):
        part = part.strip()
        if part:
            return _clip(part, limit)
    return ""


def _last_user_text(messages: list[dict]) -> str:
    """The user's own words: the last text block of the last user message with text (context
    that changes every message — recalled episodes, the date — rides in blocks before it)."""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            texts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                     and isinstance(b.get("text"), str) and b["text"].strip()] if isinstance(content, list) else []
            text = texts[-1] if texts else _text_of(content)
            if text.strip():
                return text
    return ""


def _volatile_context(messages: list[dict]) -> str:
    """The context blocks in front of the user's words in the last user message."""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), list):
            texts = [b.get("text", "") for b in m["content"] if isinstance(b, dict) and b.get("type") == "text"]
            if len(texts) > 1:
                return "\n\n".join(texts[:-1])
            return ""
    return ""



def _tool_names(body: dict) -> set[str]:
    return {t["name"] for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)}


