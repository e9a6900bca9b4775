"""From a decoded Lark message (bot/lark/events.py) to the neutral, frozen ``Inbound``
(bot/core/inbound.py) the rest of the bot uses: this adapter translates only. It imports nothing of
the event registry (which calls it), so the two make no import cycle.

Text is read from ``text`` and ``post`` messages; the bot's own @-placeholder is
stripped (so commands parse), other ``@_user_N`` placeholders become ``@Name``.
Other message types keep ``text=""`` and are answered politely by the handler.
"""

from __future__ import annotations

import json
import math
from typing import Any

from bot.core.inbound import LARK, MAX_TEXT_CHARS, Attachment, Inbound, Mention
from bot.core.text import SURROGATE, clean_text

READABLE_TYPES = frozenset({"text", "post"})

MentionRef = Mention      # Lark's mention, in the neutral shape


def message_inbound(header: Any, ev: Any, *, bot_open_id: str) -> Inbound:
    """A decoded ``im.message.receive_v1`` (its ``Header`` and ``MessageEvent``, bot/lark/events.py)
    as the neutral ``Inbound``; the message's own ``content`` JSON is read here, with limits."""
    msg = ev.message
    mentions = tuple(
        MentionRef(m.key, m.id.open_id, m.name,
                   "all" if (m.key == "@_all" or m.mentioned_type == "all") else (m.mentioned_type or "user"))
        for m in (msg.mentions or [])
    )
    mentions_bot = bool(bot_open_id) and any(m.open_id == bot_open_id for m in mentions)
    mentions_all = any(m.kind == "all" for m in mentions)

    text, error = "", ""
    attachments: tuple[Attachment, ...] = ()
    if msg.message_type in ATTACHMENT_TYPES:
        try:
            attachments = _attachments(msg.message_type, msg.message_id, json.loads(msg.content or "{}"))
        except (ValueError, RecursionError, AttributeError) as e:
            error = f"unreadable content: {type(e).__name__}"
    if msg.message_type in READABLE_TYPES:
        try:
            content = json.loads(msg.content or "{}")
            if not isinstance(content, dict):
                raise ValueError("content is not an object")
            raw = content.get("text", "") if msg.message_type == "text" else flatten_post(content)
            if msg.message_type == "post":
                attachments = post_images(content)
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
        transport=LARK,
        event_id=header.event_id,
        message_id=msg.message_id,
        chat_id=msg.chat_id,
        chat_type=msg.chat_type or "p2p",
        thread_id=msg.thread_id or "",
        root_id=msg.root_id or "",
        parent_id=msg.parent_id or "",
        sender_id=ev.sender.sender_id.open_id,
        sender_type=ev.sender.sender_type,
        sender_in_org=bool(ev.sender.tenant_key) and ev.sender.tenant_key == header.tenant_key,
        message_type=msg.message_type,
        text=text,
        truncated=truncated,
        mentions=mentions,
        mentions_bot=mentions_bot,
        mentions_all=mentions_all,
        create_time=epoch_seconds(msg.create_time or header.create_time),
        content_error=error,
        attachments=attachments,
    )


ATTACHMENT_TYPES = frozenset({"image", "file", "merge_forward", "audio"})


def _attachments(message_type: str, message_id: str, content: dict) -> tuple[Attachment, ...]:
    """Lark's content for an image (``image_key``), a file (``file_key``, ``file_name``) or a
    merged forward (nothing: its children are fetched by the message's id)."""
    if message_type == "image":
        key = content.get("image_key")
        return (Attachment("image", str(key)),) if isinstance(key, str) and key else ()
    if message_type == "file":
        key = content.get("file_key")
        if not isinstance(key, str) or not key:
            return ()
        return (Attachment("file", key, name=str(content.get("file_name") or ""),
                           size=int(content.get("file_size") or 0) if str(content.get("file_size") or "0").isdigit() else 0),)
    if message_type == "audio":
        return _audio(content)
    return (Attachment("forward", message_id),)


def _audio(content: dict) -> tuple[Attachment, ...]:
    """A voice message: ``file_key`` and ``duration`` (ms, as Lark declares it — checked again
    on the bytes, bot/media/audio.py)."""
    key, ms = content.get("file_key"), content.get("duration")
    if not isinstance(key, str) or not key:
        return ()
    seconds = ms / 1000 if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0 else 0.0
    return (Attachment("audio", key, seconds=float(min(seconds, 1e7))),)


def post_images(content: dict) -> tuple[Attachment, ...]:
    """The images inside a rich-text post (``img`` elements' ``image_key``), in order."""
    body = content if "content" in content else next(
        (v for v in content.values() if isinstance(v, dict) and "content" in v), {})
    out = []
    for para in body.get("content") or []:
        for el in para if isinstance(para, list) else []:
            if isinstance(el, dict) and el.get("tag") in ("img", "image") and isinstance(el.get("image_key"), str):
                out.append(Attachment("image", el["image_key"]))
    return tuple(out)


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
        return SURROGATE.sub("\ufffd", value) if SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def has_surrogates(raw: str) -> bool:
    """Cheap test on the event's JSON text: a surrogate character or its escape."""
    return bool(SURROGATE.search(raw)) or "\\ud" in raw.lower()
