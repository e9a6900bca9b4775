"""The handler's ``fetch`` for Lark: a message's images and files through the message-resource
API, a merged forward's children through the get-message API — Lark's errors turned into the
neutral ``AttachmentError`` reasons the user is told (bot/media/attachments.py).

Scopes (README "Permissions"): the message-resource API takes any one of ``im:message``,
``im:message:readonly`` or ``im:message.history:readonly`` (its documentation page; there is
no separate resource scope for reading what users sent); the same for a forward's children.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from bot.media.attachments import MAX_AUDIO_BYTES, MAX_FILE_BYTES, MAX_IMAGE_BYTES, AttachmentError, Fetched
from bot.core.inbound import Attachment, Inbound, Material
from bot.lark.normalize import epoch_seconds, flatten_post
from memory.sessions.speaker import escape_text, safe_name
from bot.lark.openapi.client import Category, LarkApiError, OpenApi, ResourceTooLarge

MAX_CHILDREN = 200      # of one forwarded bundle


class LarkFetcher:
    def __init__(self, api: OpenApi, names: Any = None) -> None:
        self.api = api
        self.names = names           # CachedNames: the speakers of a forward, by open_id

    async def __call__(self, inbound: Inbound, att: Attachment) -> Fetched:
        try:
            if att.kind == "forward":
                return Fetched(material=await self.forward_material(att.ref))
            cap = {"image": MAX_IMAGE_BYTES, "audio": MAX_AUDIO_BYTES}.get(att.kind, MAX_FILE_BYTES)
            data, ctype = await self.api.download(inbound.message_id, att.ref,
                                                  kind="image" if att.kind == "image" else "file",
                                                  max_bytes=cap)
            return Fetched(data=data, media_type=ctype)
        except ResourceTooLarge as e:
            raise AttachmentError("too_large", f"{e.size} bytes", kind=att.kind) from e
        except LarkApiError as e:
            reason = "forbidden" if e.category is Category.PERMISSION else "unreachable"
            raise AttachmentError(reason, e.msg[:200], kind=att.kind, **e.log_fields()) from e

    async def forward_material(self, message_id: str) -> tuple[Material, ...]:
        """A merged forward's children, one ``Material`` each: its sender's name and time are
        attributes of its own fence, so a child's newlines or a display name cannot fake
        another speaker's line."""
        data = await self.api.request("GET", f"/open-apis/im/v1/messages/{message_id}")
        items = [i for i in data.get("items") or [] if isinstance(i, dict)
                 and i.get("upper_message_id") == message_id][:MAX_CHILDREN]
        out = []
        for it in items:
            sender = (it.get("sender") or {}).get("id", "")
            name = ""
            if self.names is not None and sender:
                name = await self.names.name(sender)
            when = epoch_seconds(str(it.get("create_time") or ""))
            stamp = dt.datetime.fromtimestamp(when).isoformat(timespec="minutes") if when else ""
            out.append(Material("forward", source=str(it.get("message_id") or message_id),
                                author=name or sender or "", when=stamp, text=_child_text(it)))
        return tuple(out)

    async def forward_text(self, message_id: str) -> str:
        """The children as one text (a quoted forward): ``[time] Name: text`` lines; a name
        loses brackets and line breaks, a child's further lines are indented (and a leading
        ``[`` escaped, memory/sessions/speaker.py), so no child or name can produce another speaker's line."""
        lines = []
        for m in await self.forward_material(message_id):
            stamp = f"[{m.when.replace('T', ' ')}] " if m.when else ""
            body = escape_text(m.text).replace("\r", "").replace("\n", "\n    ")
            lines.append(f"{stamp}{safe_name(m.author) or '?'}: {body}")
        return "\n".join(lines)


def _child_text(item: dict) -> str:
    msg_type = item.get("msg_type") or ""
    try:
        content = json.loads((item.get("body") or {}).get("content") or "{}")
    except ValueError:
        content = {}
    if not isinstance(content, dict):
        content = {}
    if msg_type == "text":
        return str(content.get("text", ""))
    if msg_type == "post":
        return flatten_post(content)
    if msg_type == "image":
        return "[图片 image]"
    if msg_type == "file":
        return f"[文件 file {content.get('file_name', '')}]"
    if msg_type == "merge_forward":
        return "[合并转发 forwarded messages]"
    return f"[{msg_type}]"
