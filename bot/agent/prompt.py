"""System prompt assembly (DESIGN.md §3): stable persona first, marked for caching, then
each memory block only when non-empty, fenced as data.

Fencing: every stored text is escaped (&, <, >) before it goes between tags, so nothing
stored can close a tag, open one, or add a section.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Sequence

from bot.agent.persona import persona
from memory.similarity import normalise


def escape(text: str) -> str:
    return html.escape(text, quote=False)


def fence(tag: str, body: str) -> str:
    return f"<{tag}>\n{body}\n</{tag}>"


@dataclass(frozen=True)
class MemoryBlocks:
    """What memory gave this request; also shown in the console's memory panel."""

    path: str = "medium"
    mode: str = "work"
    rules: tuple[str, ...] = ()
    profile: str = ""
    facts: tuple[Any, ...] = ()          # memory.facts.Fact
    episodes: tuple[Any, ...] = ()       # memory.episodic.Episode
    long_term: str = ""
    summary: str = ""
    hot_turns: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "mode": self.mode,
            "rules": list(self.rules),
            "profile": self.profile,
            "facts": [{"id": f.id, "content": f.content, "category": f.category,
                       "confidence": round(f.confidence, 3), "source": f.source} for f in self.facts],
            "episodes": [{"id": e.id, "session_id": e.session_id, "summary": e.summary,
                          "keywords": list(e.keywords)} for e in self.episodes],
            "long_term": self.long_term,
            "summary": self.summary,
            "hot_turns": self.hot_turns,
        }


def unique_facts(facts: Sequence[Any]) -> tuple[Any, ...]:
    """The same fact is never injected twice in one request (by id or normalised text)."""
    seen_ids, seen_text, out = set(), set(), []
    for f in facts:
        key = normalise(f.content)
        if f.id in seen_ids or key in seen_text:
            continue
        seen_ids.add(f.id)
        seen_text.add(key)
        out.append(f)
    return tuple(out)


def build_system(blocks: MemoryBlocks, *, today: str = "") -> list[dict[str, Any]]:
    stable = {"type": "text", "text": persona(blocks.mode), "cache_control": {"type": "ephemeral"}}
    sections: list[str] = []
    if blocks.rules:
        sections.append(fence("behavioral_guidelines", "\n".join(f"- {escape(r)}" for r in blocks.rules)))
    if blocks.profile.strip():
        sections.append(fence("user_profile", escape(blocks.profile.strip())))
    if blocks.facts:
        lines = [f"- [{f.category}] {escape(f.content)} (confidence {f.confidence:.2f})" for f in blocks.facts]
        sections.append(fence("memory_context", "\n".join(lines)))
    if blocks.episodes:
        lines = []
        for e in blocks.episodes:
            kw = ", ".join(escape(k) for k in e.keywords)
            lines.append(f"- {escape(e.summary)}" + (f" (keywords: {kw})" if kw else ""))
        sections.append(fence("related_episodes", "\n".join(lines)))
    if today:
        sections.append(f"Today is {today}.")
    out = [stable]
    if sections:
        out.append({"type": "text", "text": "\n\n".join(sections)})
    return out


def system_text(system: list[dict[str, Any]]) -> str:
    return "\n\n".join(b["text"] for b in system)
