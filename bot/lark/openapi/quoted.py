"""The quoted message of a Lark reply (``parent_id``), fetched with the get-message API
(``GET /open-apis/im/v1/messages/:message_id``) and turned into the neutral ``Quote``
(bot/core/quoting.py): text, a post (its ``content_v2`` markdown when present), an image (as an
image block, like a sent image), a file (its name), a merged forward (its children, via
``LarkFetcher.forward_text``), a card (its text).

Scope: the same as attachments — any one of ``im:message``, ``im:message:readonly`` or
``im:message.history:readonly``. Without it, or for a recalled / foreign message, the quote
comes back with ``error`` set and the answer goes on without it (one log line says why).

A quoted message from another chat than the reply's is not shown either: the bot's token can
read any chat it is in, the replying user may not be in that one (a forged ``parent_id``).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

from bot.media.attachments import MAX_IMAGE_BYTES, AttachmentError, read_image
from bot.core.inbound import Inbound
from bot.lark.normalize import epoch_seconds, flatten_post
from bot.lark.openapi.client import LarkApiError, OpenApi, ResourceTooLarge
from bot.lark.openapi.resources import LarkFetcher
from bot.infra.log import get_logger
from bot.core.quoting import Quote

log = get_logger("ethan.lark.quoted")


class LarkQuotes:
    def __init__(self, api: OpenApi, names: Any = None, *, vision: Callable[[], bool] = lambda: True,
                 pool: Any = None) -> None:
        self.api = api
        self.pool = pool       # bot/media/parse_pool.py: the image is decoded there, not on the loop
        self.names = names
        self.vision = vision
        self.forwards = LarkFetcher(api, names)

    async def __call__(self, inbound: Inbound) -> Quote:
        mid = inbound.parent_id
        try:
            data = await self.api.request("GET", f"/open-apis/im/v1/messages/{mid}")
        except LarkApiError as e:
            log.info("quote.unreadable", message_id=inbound.message_id, parent_id=mid,
                     chat_id=inbound.chat_id, **e.log_fields())
            return Quote(source=mid, error=f"code {e.code}")
        items = [i for i in (data or {}).get("items") or [] if isinstance(i, dict)]
        item = next((i for i in items if i.get("message_id") == mid), items[0] if items else None)
        if item is None or item.get("deleted"):
            log.info("quote.unreadable", message_id=inbound.message_id, parent_id=mid,
                     chat_id=inbound.chat_id, reason="deleted" if item else "empty")
            return Quote(source=mid, error="deleted" if item else "empty")
        if item.get("chat_id") != inbound.chat_id:
            log.info("quote.foreign_chat", message_id=inbound.message_id, parent_id=mid,
                     chat_id=inbound.chat_id, quoted_chat_id=str(item.get("chat_id") or "")[:64])
            return Quote(source=mid, error="another chat")
        sender = item.get("sender") or {}
        author = ""
        if sender.get("sender_type") in ("app", "bot"):
            author = "Ethan" if sender.get("id_type") == "app_id" else "bot"
        elif self.names is not None and sender.get("id"):
            author = await self.names.name(str(sender["id"]))
        when = epoch_seconds(str(item.get("create_time") or ""))
        iso = dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat(timespec="seconds") if when else ""
        text, images = await self._content(mid, item, inbound.sender_id)
        return Quote(source=mid, author=author, when=iso, text=text, images=images)

    async def _content(self, mid: str, item: dict, sender: str) -> tuple[str, tuple[dict, ...]]:
        msg_type = str(item.get("msg_type") or "")
        content = message_content(item)
        if msg_type == "text":
            return str(content.get("text", "")), ()
        if msg_type == "post":
            v2 = content.get("content_v2")
            return (v2 if isinstance(v2, str) and v2.strip() else flatten_post(content)), ()
        if msg_type == "image":
            key = content.get("image_key")
            if not isinstance(key, str) or not key:
                return "[图片 image]", ()
            if not self.vision() or self.pool is None:
                return f"[图片 image {key} — 当前模型不支持看图 / this model cannot see images]", ()
            try:
                raw, _ = await self.api.download(mid, key, kind="image", max_bytes=MAX_IMAGE_BYTES)
                return f"[图片 image {key}]", (await read_image(self.pool, raw, key=sender),)
            except (LarkApiError, ResourceTooLarge, AttachmentError) as e:
                log.info("quote.image_unreadable", parent_id=mid, error=str(e)[:200])
                return f"[图片 image {key} — 无法读取 / could not be read]", ()
        if msg_type == "file":
            return f"[文件 file {content.get('file_name', '')}]", ()
        if msg_type == "merge_forward":
            try:
                return "[合并转发 forwarded messages]\n" + await self.forwards.forward_text(mid), ()
            except LarkApiError as e:
                log.info("quote.forward_unreadable", parent_id=mid, **e.log_fields())
                return "[合并转发 forwarded messages — 无法读取 / could not be read]", ()
        if msg_type == "interactive":
            return "[卡片 card]\n" + "\n".join(card_texts(content)), ()
        return f"[{msg_type or 'message'}]", ()


def message_content(item: dict) -> dict:
    """A listed or fetched message's ``body.content`` (a JSON string) as a dict; {} when it is
    not one (Lark's own messages are; a foreign or broken one still gets an answer)."""
    try:
        content = json.loads((item.get("body") or {}).get("content") or "{}")
    except (ValueError, RecursionError, TypeError):
        return {}
    return content if isinstance(content, dict) else {}


def card_texts(node: Any) -> list[str]:
    """The readable strings of a card as Lark returns it (title, text and markdown elements,
    button labels), in order; tag names, ids and URLs left out."""
    out: list[str] = []

    def walk(n: Any) -> None:
        if isinstance(n, dict):
            for k, v in n.items():
                if k in ("text", "content", "title") and isinstance(v, str):
                    if v.strip():
                        out.append(v.strip())
                else:
                    walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    walk(node)
    return out
