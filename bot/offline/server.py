"""The built-in offline model's wire: the Anthropic Messages API, served on our own aiohttp server.

Without ``ANTHROPIC_API_KEY`` the app points its ``anthropic.AsyncAnthropic`` client at
``<server>{prefix}`` (``POST {prefix}/v1/messages``), so the console and the terminal chat
go through exactly the same agent code — tool loop, memory tools, consolidation — as with
Claude. This module is only the wire (the message envelope, usage, SSE framing, the 400 for a
body that is not a JSON object); what is answered is ``bot/offline/rules.py``.

Streaming (``"stream": true``) sends the event sequence the SDK parses: ``message_start``,
then ``ping``, then per block ``content_block_start`` / ``content_block_delta`` (``text_delta`` or
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop_reason, usage)
and ``message_stop``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

from aiohttp import web

from bot.infra.log import get_logger
from bot.offline.rules import MARK, respond

log = get_logger("ethan.offline")

MODEL_NAME = "ethan-offline"
TEXT_CHUNK = 16          # characters per text_delta when streaming
JSON_CHUNK = 24          # characters per input_json_delta when streaming


def _estimate_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, ensure_ascii=False, default=str)) // 4)


def message(body: dict) -> dict[str, Any]:
    try:
        content, stop = respond(body)
    except Exception as e:  # noqa: BLE001 — odd input gets an answer, never a 500
        log.warning("offline.odd_input", error=f"{type(e).__name__}: {e}"[:200])
        content, stop = [{"type": "text", "text": MARK + "抱歉，我没看懂这个请求。 / Sorry, I couldn't read that request."}], "end_turn"
    digest = hashlib.sha256(json.dumps(content, ensure_ascii=False, sort_keys=True).encode()).hexdigest()
    model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else MODEL_NAME
    return {
        "id": f"msg_offline_{digest[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": _estimate_tokens(body.get("messages")) + _estimate_tokens(body.get("system")),
                  "output_tokens": _estimate_tokens(content)},
    }


def _chunks(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i:i + size]


def sse_events(msg: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Messages API's streaming event sequence for a finished message."""
    start = dict(msg, content=[], stop_reason=None, stop_sequence=None,
                 usage={"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 1})
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(msg["content"]):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "text", "text": ""}}
            for piece in _chunks(block["text"], TEXT_CHUNK):
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": piece}}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "tool_use", "id": block["id"],
                                                            "name": block["name"], "input": {}}}
            for piece in _chunks(json.dumps(block["input"], ensure_ascii=False), JSON_CHUNK):
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": piece}}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                            "usage": {"output_tokens": msg["usage"]["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------

def _error(status: int, kind: str, text: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": text}}, status=status)


def setup_offline_model(web_app: web.Application, prefix: str) -> None:
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def _body(request: web.Request) -> dict | None:
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None

    async def messages(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if body is None:
            return _error(400, "invalid_request_error", "the request body must be a JSON object")
        msg = message(body)
        headers = {"request-id": "req_" + msg["id"].removeprefix("msg_")}
        if body.get("stream") is not True:
            return web.json_response(msg, headers=headers, dumps=lambda v: json.dumps(v, ensure_ascii=False))
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for event, data in sse_events(msg):
            await resp.write(f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode())
        await resp.write_eof()
        return resp

    async def count_tokens(request: web.Request) -> web.Response:
        body = await _body(request)
        if body is None:
            return _error(400, "invalid_request_error", "the request body must be a JSON object")
        return web.json_response({"input_tokens": _estimate_tokens(body.get("messages")) + _estimate_tokens(body.get("system"))})

    web_app.router.add_post(f"{prefix}/v1/messages", messages)
    web_app.router.add_post(f"{prefix}/v1/messages/count_tokens", count_tokens)
