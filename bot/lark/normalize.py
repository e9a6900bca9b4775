"""From a verified Lark event to the frozen ``Inbound`` the rest of the bot uses.

Text is read from ``text`` and ``post`` messages; the bot's own @-placeholder is
stripped (so commands parse), other ``@_user_N`` placeholders become ``@Name``.
Other message types keep ``text=""`` and are answered politely by the handler.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from bot.lark.events import Envelope, MessageEvent
from memory.scope import Scope, conversation_key

BOT_SENDER_TYPES = frozenset({"bot", "app"})
READABLE_TYPES = frozenset({"text", "post"})
MAX_TEXT_CHARS = 20_000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")   # lone surrogates cannot be stored as UTF-8


@dataclass(frozen=True, slots=True)
class MentionRef:
    key: str
    open_id: str
    name: str
    kind: str      # user | bot | all


@dataclass(frozen=True, slots=True)
class Inbound:
    event_id: str
    message_id: str
    chat_id: str
    chat_type: str            # p2p | group
    thread_id: str
    root_id: str
    sender_id: str
    sender_type: str
    message_type: str
    text: str                 # readable text, bot mention stripped; "" when unreadable
    truncated: bool           # text was cut at MAX_TEXT_CHARS for the model
    mentions: tuple[MentionRef, ...]
    mentions_bot: bool
    mentions_all: bool
    create_time: float        # seconds since epoch, as Lark reports
    sender_name: str = ""
    content_error: str = ""   # why content could not be read, for the log

    @property
    def conv_key(self) -> str:
        return conversation_key(self.chat_id, self.thread_id)

    @property
    def from_bot(self) -> bool:
        return self.sender_type in BOT_SENDER_TYPES

    @property
    def in_thread(self) -> bool:
        return bool(self.thread_id)

    def scope(self, *, is_admin: bool) -> Scope:
        return Scope(user_id=self.sender_id, chat_id=self.chat_id, chat_type=self.chat_type,
                     thread_id=self.thread_id, message_id=self.message_id, is_admin=is_admin)


def parse_event(envelope: Envelope, *, bot_open_id: str) -> Inbound:
    ev = MessageEvent.model_validate(envelope.event)
    msg = ev.message
    mentions = tuple(
        MentionRef(m.key, m.id.open_id, m.name,
                   "all" if (m.key == "@_all" or m.mentioned_type == "all") else (m.mentioned_type or "user"))
        for m in (msg.mentions or [])
    )
    mentions_bot = bool(bot_open_id) and any(m.open_id == bot_open_id for m in mentions)
    mentions_all = any(m.kind == "all" for m in mentions)

    text, error = "", ""
    if msg.message_type in READABLE_TYPES:
        try:
            content = json.loads(msg.content or "{}")
            if not isinstance(content, dict):
                raise ValueError("content is not an object")
            raw = content.get("text", "") if msg.message_type == "text" else flatten_post(content)
            if not isinstance(raw, str):
                raise ValueError("text is not a string")
            text = render_mentions(raw, mentions, bot_open_id)
        except (ValueError, RecursionError) as e:   # content nested too deep is unreadable, not a crash
            error = f"unreadable content: {type(e).__name__ if isinstance(e, RecursionError) else e}"
    text = clean_text(text)
    truncated = len(text) > MAX_TEXT_CHARS
    if truncated:
        text = text[:MAX_TEXT_CHARS]
    return Inbound(
        event_id=envelope.header.event_id,
        message_id=msg.message_id,
        chat_id=msg.chat_id,
        chat_type=msg.chat_type or "p2p",
        thread_id=msg.thread_id or "",
        root_id=msg.root_id or "",
        sender_id=ev.sender.sender_id.open_id,
        sender_type=ev.sender.sender_type,
        message_type=msg.message_type,
        text=text,
        truncated=truncated,
        mentions=mentions,
        mentions_bot=mentions_bot,
        mentions_all=mentions_all,
        create_time=epoch_seconds(msg.create_time or envelope.header.create_time),
        content_error=error,
    )


def render_mentions(text: str, mentions: tuple[MentionRef, ...], bot_open_id: str) -> str:
    # Longest keys first so @_user_10 is not eaten by @_user_1.
    for m in sorted(mentions, key=lambda m: len(m.key), reverse=True):
        if not m.key:
            continue
        if m.open_id and m.open_id == bot_open_id:
            text = text.replace(m.key, "")
        elif m.kind == "all":
            text = text.replace(m.key, "@所有人")
        else:
            text = text.replace(m.key, f"@{m.name or 'someone'}")
    return text


def flatten_post(content: dict) -> str:
    """Rich text: text runs read, links as text, images noted as [image]."""
    body = content
    if "content" not in body:
        # Some deliveries wrap by locale: {"zh_cn": {"title":…, "content": [[…]]}}
        body = next((v for v in content.values() if isinstance(v, dict) and "content" in v), {})
    lines: list[str] = []
    title = body.get("title") or ""
    if title:
        lines.append(str(title))
    for para in body.get("content") or []:
        parts: list[str] = []
        for el in para if isinstance(para, list) else []:
            if not isinstance(el, dict):
                continue
            tag = el.get("tag")
            if tag in ("text", "md"):
                parts.append(str(el.get("text", "")))
            elif tag == "a":
                label, href = str(el.get("text", "")), str(el.get("href", ""))
                parts.append(f"{label} ({href})" if href and href != label else label or href)
            elif tag == "at":
                parts.append(str(el.get("user_id", "")))  # placeholder, rendered by render_mentions
            elif tag in ("img", "image"):
                parts.append("[image]")
            elif tag == "media":
                parts.append("[video]")
            elif tag == "emotion":
                parts.append(f"[{el.get('emoji_type', 'emoji')}]")
            elif tag == "code_block":
                parts.append(str(el.get("text", "")))
        lines.append("".join(parts))
    return "\n".join(lines)


def clean_text(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub("", text)
    text = _SURROGATE.sub("\ufffd", text)
    return text.strip()


def epoch_seconds(value: str | None) -> float:
    """Lark timestamps come as strings in ms (or s); 0.0 when unusable (not a number, NaN,
    infinite, negative: "nan" became a NULL create_time, which the inbox then took for a
    duplicate)."""
    try:
        v = float(value or 0)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(v) or v < 0:
        return 0.0
    return v / 1000 if v > 1e11 else v


def scrub(value: Any) -> Any:
    """The decoded event with every lone surrogate replaced by U+FFFD, keys included. JSON may
    escape them (``"\\ud800"``) but UTF-8 — SQLite, Lark, the model — cannot carry them: one in
    a text was accepted at intake and refused by the handler, unanswered."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def has_surrogates(raw: str) -> bool:
    """Cheap test on the event's JSON text: a surrogate character or its escape."""
    return bool(_SURROGATE.search(raw)) or "\\ud" in raw.lower()
