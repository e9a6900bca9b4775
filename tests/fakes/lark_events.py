"""Lark events exactly as the Open Platform sends them, and the webhook wire format.

- :func:`load_fixture` -- a fixture (``tests/fixtures/lark``, or ``$ETHAN_FIXTURES``)
  with ``create_time`` set to now (ms) and, optionally, fresh ids.
- :func:`make_text_event` -- a schema 2.0 ``im.message.receive_v1`` event built from arguments.
- :func:`url_verification` -- the challenge Lark sends when a request URL is saved.
- :func:`encrypt` / :func:`decrypt` -- AES-256-CBC as Lark uses it (key = sha256(encrypt_key),
  random 16-byte IV prefixed, PKCS#7, base64).
- :func:`sign` -- ``X-Lark-Signature`` = hex sha256(timestamp + nonce + encrypt_key + body).
- :func:`webhook_request` -- ``(headers, body)`` of a webhook POST, encrypted and signed when an
  encrypt key is given, else plain JSON carrying the verification token.

Header names use Lark's exact casing (``X-Lark-Request-Timestamp``, ...): lark-oapi's own
dispatcher looks them up case-sensitively.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import os
import secrets
import time
import uuid as _uuid
from pathlib import Path
from typing import Any

from Crypto.Cipher import AES

__all__ = [
    "BOT_OPEN_ID",
    "FIXTURES_DIR",
    "KNOWN_NAMES",
    "decrypt",
    "encrypt",
    "fixtures_dir",
    "load_fixture",
    "make_text_event",
    "make_image_event",
    "make_file_event",
    "make_forward_event",
    "make_recalled_event",
    "make_bot_added_event",
    "make_p2p_entered_event",
    "make_card_action_event",
    "mention",
    "now_ms",
    "sign",
    "url_verification",
    "webhook_request",
]

BOT_OPEN_ID = "ou_bot"
KNOWN_NAMES = {"ou_bot": "Ethan", "ou_alice": "Alice", "ou_bob": "Bob", "ou_carol": "Carol"}
FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "lark"

_seq = itertools.count(1)


def fixtures_dir() -> Path:
    """``$ETHAN_FIXTURES`` if set, else ``tests/fixtures/lark`` (copied from the Lark docs' shapes;
    the repository holds everything its tests use)."""
    env = os.environ.get("ETHAN_FIXTURES")
    return Path(env) if env else FIXTURES_DIR


def now_ms() -> int:
    return int(time.time() * 1000)


def _fresh_suffix() -> str:
    return f"{next(_seq):04d}_{_uuid.uuid4().hex[:12]}"


def load_fixture(name: str, *, fresh_ids: bool = False, create_time_ms: int | None = None) -> dict:
    """Load ``<name>.json`` with ``create_time`` (header and message) set to now in ms.

    ``fresh_ids=True`` gives the event a new ``event_id`` and the message a new
    ``message_id`` (so repeated loads are not deduplicated by the bot).
    """
    path = fixtures_dir() / (name if name.endswith(".json") else f"{name}.json")
    event = json.loads(path.read_text(encoding="utf-8"))
    ts = str(create_time_ms if create_time_ms is not None else now_ms())
    header = event.get("header")
    message = (event.get("event") or {}).get("message")
    if isinstance(header, dict) and "create_time" in header:
        header["create_time"] = ts
    if isinstance(message, dict):
        message["create_time"] = ts
        if "update_time" in message:
            message["update_time"] = ts
    if fresh_ids:
        suffix = _fresh_suffix()
        if isinstance(header, dict):
            header["event_id"] = f"ev_{suffix}"
        if isinstance(message, dict):
            message["message_id"] = f"om_{suffix}"
    return event


def mention(open_id: str, name: str | None = None, *, key: str, mentioned_type: str | None = None,
            tenant_key: str = "tk_demo") -> dict:
    """One entry of ``message.mentions`` as Lark sends it."""
    if open_id == "all":
        return {"key": key, "id": {"union_id": "", "user_id": "", "open_id": ""},
                "name": name or "所有人", "tenant_key": tenant_key, "mentioned_type": "all"}
    local = open_id.split("_", 1)[-1]
    return {
        "key": key,
        "id": {"union_id": f"on_{local}", "user_id": "" if open_id == BOT_OPEN_ID else local,
               "open_id": open_id},
        "name": name or KNOWN_NAMES.get(open_id, local.capitalize()),
        "tenant_key": tenant_key,
        "mentioned_type": mentioned_type or ("bot" if open_id == BOT_OPEN_ID else "user"),
    }


def make_text_event(
    text: str,
    *,
    chat_id: str,
    chat_type: str = "p2p",
    sender: str = "ou_alice",
    message_id: str | None = None,
    event_id: str | None = None,
    mentions: list[dict | str] | None = None,
    thread_id: str = "",
    root_id: str = "",
    parent_id: str | None = None,
    create_time_ms: int | None = None,
    sender_type: str = "user",
    message_type: str = "text",
    content: dict | str | None = None,
    app_id: str = "cli_test",
    tenant_key: str = "tk_demo",
    token: str = "vtoken",
    sender_tenant_key: str | None = None,
) -> dict:
    """A schema 2.0 ``im.message.receive_v1`` event.

    ``sender_tenant_key`` (default ``tenant_key``, the app's tenant in the header): another
    organisation's, for an external member of a shared group.

    ``mentions`` items are full mention dicts or open_ids (``"ou_bot"``, ``"all"``); open_ids get
    keys ``@_user_1``, ``@_user_2``... (``@_all`` for ``"all"``), and a key missing from ``text``
    is prepended to it, the way Lark renders "@Ethan hi" as ``"@_user_1 hi"``.
    ``content`` overrides the message content (dict or JSON string) for non-text types.
    Ids default to fresh unique values; ``create_time`` defaults to now.
    """
    ts = str(create_time_ms if create_time_ms is not None else now_ms())
    suffix = _fresh_suffix()
    built: list[dict] = []
    n = 0
    for item in mentions or []:
        if isinstance(item, dict):
            built.append(item)
            continue
        if item == "all":
            built.append(mention("all", key="@_all"))
        else:
            n += 1
            built.append(mention(item, key=f"@_user_{n}"))
    if message_type == "text" and content is None:
        missing = [m["key"] for m in built if m["key"] not in text]
        if missing:
            text = " ".join(missing) + " " + text
        content_str = json.dumps({"text": text}, ensure_ascii=False)
    elif content is None:
        content_str = json.dumps({"text": text}, ensure_ascii=False)
    else:
        content_str = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    local = sender.split("_", 1)[-1]
    message: dict[str, Any] = {
        "message_id": message_id or f"om_{suffix}",
        "root_id": root_id,
        "parent_id": root_id if parent_id is None else parent_id,
        "create_time": ts,
        "update_time": ts,
        "chat_id": chat_id,
        "thread_id": thread_id,
        "chat_type": chat_type,
        "message_type": message_type,
        "content": content_str,
        "user_agent": "",
    }
    if built:
        message["mentions"] = built
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id or f"ev_{suffix}",
            "event_type": "im.message.receive_v1",
            "create_time": ts,
            "token": token,
            "app_id": app_id,
            "tenant_key": tenant_key,
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": sender, "union_id": f"on_{local}", "user_id": local},
                "sender_type": sender_type,
                "tenant_key": tenant_key if sender_tenant_key is None else sender_tenant_key,
            },
            "message": message,
        },
    }


def _envelope(event_type: str, event: dict, *, event_id: str | None = None, app_id: str = "cli_test",
              tenant_key: str = "tk_demo", token: str = "vtoken", create_time_ms: int | None = None) -> dict:
    return {
        "schema": "2.0",
        "header": {"event_id": event_id or f"ev_{_fresh_suffix()}", "event_type": event_type,
                   "create_time": str(create_time_ms if create_time_ms is not None else now_ms()),
                   "token": token, "app_id": app_id, "tenant_key": tenant_key},
        "event": event,
    }


def _user_id(open_id: str) -> dict:
    local = open_id.split("_", 1)[-1]
    return {"open_id": open_id, "union_id": f"on_{local}", "user_id": local}


def make_image_event(image_key: str, *, chat_id: str, **kw) -> dict:
    """An ``image`` message (content ``{"image_key": …}``), as image.json."""
    return make_text_event("", chat_id=chat_id, message_type="image", content={"image_key": image_key}, **kw)


def make_file_event(file_key: str, file_name: str, *, chat_id: str, **kw) -> dict:
    """A ``file`` message (content ``{"file_key": …, "file_name": …}``)."""
    return make_text_event("", chat_id=chat_id, message_type="file",
                           content={"file_key": file_key, "file_name": file_name}, **kw)


def make_audio_event(file_key: str, *, chat_id: str, duration_ms: int = 3000, **kw) -> dict:
    """An ``audio`` (voice) message: content ``{"file_key": …, "duration": <ms>}``."""
    return make_text_event("", chat_id=chat_id, message_type="audio",
                           content={"file_key": file_key, "duration": duration_ms}, **kw)


def make_forward_event(*, chat_id: str, **kw) -> dict:
    """A ``merge_forward`` message: its content names no children; they are fetched."""
    return make_text_event("", chat_id=chat_id, message_type="merge_forward",
                           content={"content": "Merged and Forwarded Message"}, **kw)


def make_recalled_event(message_id: str, *, chat_id: str, recall_type: str = "message_owner",
                        **kw) -> dict:
    """``im.message.recalled_v1`` (lark_oapi P2ImMessageRecalledV1Data)."""
    return _envelope("im.message.recalled_v1", {
        "message_id": message_id, "chat_id": chat_id, "recall_time": str(now_ms()),
        "recall_type": recall_type}, **kw)


def make_bot_added_event(chat_id: str, *, operator: str = "ou_alice", name: str = "Team",
                         deleted: bool = False, **kw) -> dict:
    """``im.chat.member.bot.added_v1`` (or ``…deleted_v1``)."""
    kind = "deleted" if deleted else "added"
    return _envelope(f"im.chat.member.bot.{kind}_v1", {
        "chat_id": chat_id, "operator_id": _user_id(operator), "external": False,
        "operator_tenant_key": "tk_demo", "name": name}, **kw)


def make_p2p_entered_event(chat_id: str, *, operator: str = "ou_alice", **kw) -> dict:
    """``im.chat.access_event.bot_p2p_chat_entered_v1``."""
    return _envelope("im.chat.access_event.bot_p2p_chat_entered_v1", {
        "chat_id": chat_id, "operator_id": _user_id(operator), "last_message_id": "",
        "last_message_create_time": ""}, **kw)


def make_card_action_event(value: dict, *, chat_id: str, message_id: str, operator: str = "ou_alice",
                           form_value: dict | None = None, name: str = "", **kw) -> dict:
    """``card.action.trigger``: a click on a button of the bot's card (new-style callback);
    ``form_value``: a form's submit (its inputs by name), with the button's ``name``."""
    local = operator.split("_", 1)[-1]
    action: dict = {"value": value, "tag": "button"}
    if form_value is not None:
        action.update(form_value=form_value, name=name)
    return _envelope("card.action.trigger", {
        "operator": {"tenant_key": "tk_demo", "user_id": local, "open_id": operator,
                     "union_id": f"on_{local}"},
        "token": f"c-{_fresh_suffix()}", "action": action,
        "host": "im_message", "delivery_type": "",
        "context": {"open_message_id": message_id, "open_chat_id": chat_id}}, **kw)


def url_verification(challenge: str, token: str) -> dict:
    return {"challenge": challenge, "token": token, "type": "url_verification"}


# ---- crypto -----------------------------------------------------------------------------------


def _key(encrypt_key: str | bytes) -> bytes:
    raw = encrypt_key.encode() if isinstance(encrypt_key, str) else encrypt_key
    return hashlib.sha256(raw).digest()


def encrypt(plaintext: bytes | str, encrypt_key: str | bytes, *, iv: bytes | None = None) -> str:
    """AES-256-CBC with key sha256(encrypt_key), random IV prefixed, PKCS#7, base64."""
    data = plaintext.encode() if isinstance(plaintext, str) else plaintext
    iv = iv if iv is not None else secrets.token_bytes(16)
    pad = 16 - len(data) % 16
    cipher = AES.new(_key(encrypt_key), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(data + bytes([pad]) * pad)).decode()


def decrypt(encrypted: str, encrypt_key: str | bytes) -> bytes:
    """Inverse of :func:`encrypt`; raises ``ValueError`` on a wrong key / corrupt data."""
    raw = base64.b64decode(encrypted)
    if len(raw) < 32 or len(raw) % 16:
        raise ValueError("invalid ciphertext length")
    plain = AES.new(_key(encrypt_key), AES.MODE_CBC, raw[:16]).decrypt(raw[16:])
    pad = plain[-1]
    if not 1 <= pad <= 16 or plain[-pad:] != bytes([pad]) * pad:
        raise ValueError("invalid PKCS#7 padding (wrong encrypt key?)")
    return plain[:-pad]


def sign(timestamp: str | int, nonce: str, encrypt_key: str, body: bytes) -> str:
    """``X-Lark-Signature``: lowercase hex sha256(timestamp + nonce + encrypt_key + raw body)."""
    return hashlib.sha256(f"{timestamp}{nonce}{encrypt_key}".encode() + body).hexdigest()


def webhook_request(
    event: dict,
    *,
    encrypt_key: str | None = None,
    verification_token: str | None = None,
    timestamp: str | int | None = None,
    nonce: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """The ``(headers, body)`` of Lark's webhook POST carrying ``event``.

    ``verification_token`` (when given) is written into the event -- ``header.token`` for
    schema 2.0, top-level ``token`` otherwise -- as Lark does. With ``encrypt_key`` the body is
    ``{"encrypt": "..."}`` and the headers carry ``X-Lark-Request-Timestamp`` (default: now, in
    seconds), ``X-Lark-Request-Nonce`` (default: random) and ``X-Lark-Signature``.
    """
    event = copy.deepcopy(event)
    if verification_token is not None:
        if isinstance(event.get("header"), dict):
            event["header"]["token"] = verification_token
        else:
            event["token"] = verification_token
    plain = json.dumps(event, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if encrypt_key is None:
        return headers, plain
    body = json.dumps({"encrypt": encrypt(plain, encrypt_key)}).encode()
    ts = str(timestamp if timestamp is not None else int(time.time()))
    nonce = nonce if nonce is not None else secrets.token_hex(8)
    headers.update({
        "X-Lark-Request-Timestamp": ts,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": sign(ts, nonce, encrypt_key, body),
    })
    return headers, body
