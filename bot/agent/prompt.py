"""What the model sees (DESIGN.md §3): the system prompt, the request layout and its
prompt-cache breakpoints.

Stable first, volatile last, so the provider's prompt cache serves most of every request
(Anthropic reads cached input at 0.1×, writes it at 1.25×; OpenAI-compatible providers cache a
stable prefix by themselves)::

    tools                           fixed
    system[0]  persona              fixed per mode                                   ◀ A
    system[1]  <behavioral_guidelines> <user_profile> <memory_context>               ◀ B
               slow: changes only when a rule, the profile or a fact does (facts in the
               order they were learned, so re-ranking by last_accessed moves nothing)
    messages   [长期记忆] / 好的。      changes at a fold (every warm_capacity turns)
               [对话摘要] / 好的。      one block per warm summary, appended every
                                       compress_batch turns                           ◀ C
               the replayed turns      append-only between compressions               ◀ D
               the current message:    <related_episodes>…, Today is …  (change with
                                       every message, never cached), then the user's words

A–D are breakpoints (``"cache": True``, memory/llm.py; the Anthropic adapter turns them into
``cache_control``): at most four, and none where the prefix is shorter than the model's minimum
cacheable length (``memory.models.caps(model).cache_min_tokens``) — it would cache nothing.
Between two compressions a request reads everything up to the previous turn from the cache
and writes one turn; a compression re-writes the replayed turns but still reads up to the last
unchanged summary (C), a fold up to the system (B).

Fencing: every stored text is escaped (&, <, >) before it goes between tags, so nothing
stored can close a tag, open one, or add a section — the same wherever the block sits (the
recalled episodes travel in the current user message, fenced exactly as in the system prompt).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from bot.agent.persona import persona
from bot.core.inbound import Material
from memory.episodes.evidence import episode_lines
from memory.models import caps
from memory.text.similarity import normalise
from memory.text.untrusted import TAG as UNTRUSTED_TAG
from memory.text.tokens import estimate_tokens
from memory.working.view import LONG_TERM_TAG, SUMMARY_TAG

MAX_BREAKPOINTS = 4             # Anthropic refuses a request with more


def escape(text: str) -> str:
    return html.escape(text, quote=False)


def fence(tag: str, body: str) -> str:
    return f"<{tag}>\n{body}\n</{tag}>"


def fence_material(*items: Material) -> str:
    """Third-party material (``bot.core.inbound.Material``) as data, one fence per item, joined by
    blank lines: ``<untrusted_content kind="…" source="…" author="…" time="…">escaped
    text</untrusted_content>``. Attributes and text are escaped, so the material cannot close
    its fence, forge another or a speaker line; memory/text/untrusted.py recognises the form (the
    consolidator never takes the user's facts from it)."""
    a = lambda v: html.escape(v or "", quote=True)  # noqa: E731
    return "\n\n".join(
        f'<{UNTRUSTED_TAG} kind="{a(m.kind)}" source="{a(m.source)}" author="{a(m.author)}" '
        f'time="{a(m.when)}">{escape(m.text)}</{UNTRUSTED_TAG}>' for m in items)


def with_material(text: str, material: Sequence[Material]) -> str:
    """The user's words, then their material fenced (what is stored and what the model reads)."""
    if not material:
        return text
    return "\n\n".join(x for x in (text, fence_material(*material)) if x)


@dataclass(frozen=True)
class MemoryBlocks:
    """What memory gave this request; also shown in the console's memory panel."""

    path: str = "medium"
    mode: str = "work"
    rules: tuple[str, ...] = ()
    profile: str = ""
    facts: tuple[Any, ...] = ()          # memory.facts.store.Fact
    episodes: tuple[Any, ...] = ()       # memory.episodes.record.Episode
    long_term: str = ""
    summary: str = ""
    hot_turns: int = 0
    extra: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)   # the answer's token usage, once it is known

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
            "tokens": token_split(self.usage) if self.usage else None,
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


def token_split(usage: dict) -> dict[str, int]:
    """Input tokens of one answer (all its model calls) as the console shows them."""
    return {"cached": int(usage.get("cache_read_tokens", 0)), "written": int(usage.get("cache_write_tokens", 0)),
            "uncached": int(usage.get("input_tokens", 0)), "output": int(usage.get("output_tokens", 0))}


def build_system(blocks: MemoryBlocks, *, today: str = "") -> list[dict[str, Any]]:
    """The system prompt: the persona, then the slowly changing memory, each block only when
    non-empty. What changes with every message is not here (``volatile_context``); ``today``
    is accepted for callers of the older signature and ignored."""
    out: list[dict[str, Any]] = [{"type": "text", "text": persona(blocks.mode)}]
    sections: list[str] = []
    if blocks.rules:
        sections.append(fence("behavioral_guidelines", "\n".join(f"- {escape(r)}" for r in blocks.rules)))
    if blocks.profile.strip():
        sections.append(fence("user_profile", escape(blocks.profile.strip())))
    if blocks.facts:
        # Learned order (id), not rank: the ranking's last_accessed tie-break changes on every
        # injection and would move lines, invalidating the cached prefix for nothing.
        ordered = sorted(blocks.facts, key=lambda f: f.id)
        lines = [f"- [{f.category}] {escape(f.content)} (confidence {f.confidence:.2f})" for f in ordered]
        sections.append(fence("memory_context", "\n".join(lines)))
    if sections:
        out.append({"type": "text", "text": "\n\n".join(sections)})
    return out


def volatile_context(blocks: MemoryBlocks, *, today: str = "") -> str:
    """What changes with every message — recalled episodes, the date — fenced the same way
    as the system prompt's blocks; sent in front of the user's words, after every cached part."""
    sections: list[str] = []
    if blocks.episodes:
        # each episode: its heading (date, summary, keywords), then the lines said there that
        # answer the message, with date and speaker (memory.episodes.evidence.episode_lines; the budget
        # is recall's, docs/memory.md)
        lines = [escape(line) for e in blocks.episodes for line in episode_lines(e)]
        sections.append(fence("related_episodes", "\n".join(lines)))
    if today:
        sections.append(f"Today is {today}.")
    return "\n\n".join(sections)


def with_context(messages: list[dict[str, Any]], context: str) -> list[dict[str, Any]]:
    """``messages`` with ``context`` as a text block in front of the last (current) user message."""
    if not context or not messages or messages[-1].get("role") != "user":
        return list(messages)
    last = messages[-1]
    content = last["content"]
    rest = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*messages[:-1], {**last, "content": [{"type": "text", "text": context}, *rest]}]


def with_images(messages: list[dict[str, Any]], images: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The current user message with ``images`` in front of its last text block (the user's
    words: ``text about the image`` reads best after it; its cache mark stays last)."""
    if not images or not messages or messages[-1].get("role") != "user":
        return list(messages)
    last = messages[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*messages[:-1], {**last, "content": [*blocks[:-1], *images, blocks[-1]]}]


def _chars(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") if b.get("type") == "text" else json.dumps(b, ensure_ascii=False)
                   for b in content if isinstance(b, dict))


def _first_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return next((b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"), "")


def _marked(content: Any) -> list[dict[str, Any]]:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    blocks[-1]["cache"] = True
    return blocks


def mark_cache(system: list[dict[str, Any]], messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]],
               *, model: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copies of ``system`` and ``messages`` with the breakpoints A–D (module docstring) as
    ``"cache": True``: only where the prefix reaches the model's minimum cacheable length
    (estimated generously: a breakpoint that caches nothing costs nothing, a missing one
    costs the whole prefix), at most four (the first and the last three)."""
    minimum = caps(model).cache_min_tokens
    # candidates: ("system" | "message", index, estimated tokens of the prefix through it)
    candidates: list[tuple[str, int, int]] = []
    tokens = estimate_tokens(json.dumps(list(tools), ensure_ascii=False)) if tools else 0
    for i, b in enumerate(system):
        tokens += estimate_tokens(b.get("text", ""))
        candidates.append(("system", i, tokens))
    pair_end = stable_end = -1
    for i, m in enumerate(messages[:-1]):
        first = _first_text(m.get("content", ""))
        if m.get("role") == "user" and (first.startswith(SUMMARY_TAG) or first.startswith(LONG_TERM_TAG)):
            pair_end = i
    if len(messages) >= 2 and messages[-1].get("role") == "user" and messages[-2].get("role") == "assistant":
        stable_end = len(messages) - 2
    for i, m in enumerate(messages):
        if i > max(pair_end, stable_end):
            break
        tokens += estimate_tokens(_chars(m.get("content", "")))
        if i in (pair_end, stable_end):
            candidates.append(("message", i, tokens))
    chosen = [c for c in candidates if c[2] >= minimum]
    if len(chosen) > MAX_BREAKPOINTS:
        chosen = [chosen[0], *chosen[-(MAX_BREAKPOINTS - 1):]]
    system = [dict(b) for b in system]
    messages = list(messages)
    for where, i, _ in chosen:
        if where == "system":
            system[i]["cache"] = True
        else:
            messages[i] = {**messages[i], "content": _marked(messages[i]["content"])}
    return system, messages
