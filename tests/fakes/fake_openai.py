"""A fake OpenAI-compatible Chat Completions server, driven by the real ``openai`` SDK over loopback.

``POST /v1/chat/completions`` answers like OpenAI's API -- a ``chat.completion`` JSON object, or
Server-Sent Events of ``chat.completion.chunk`` objects when ``"stream": true`` (a first chunk
with ``delta.role``, ``delta.content`` pieces, ``delta.tool_calls`` with the call's ``id``,
``type`` and ``function.name`` first and its ``function.arguments`` in pieces by ``index``, a
chunk with ``finish_reason``, a ``usage`` chunk with empty ``choices`` when
``stream_options.include_usage`` is set, then ``data: [DONE]``). ``GET /v1/models`` and
``GET /v1/models/{id}`` list and describe models. It runs on its own thread and event loop,
like :class:`tests.fakes.fake_anthropic.FakeAnthropic`, and is scripted the same way with the
same response objects (``Text``, ``ToolUse``, ``Turn``, ``Error``, ``Stall``, ``Delay``)::

    with FakeOpenAI() as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        fake.script(ToolUse("memory_write", {...}), Text("noted"))

**The same assertions hold on both fakes**: every recorded request's ``.json`` is the request
seen in the Messages API's shape (``system`` blocks, ``messages`` with ``text`` / ``tool_use`` /
``tool_result`` blocks, ``tools`` with ``input_schema``, a forced function as
``tool_choice: {"type": "tool", "name"}``, ``response_format: json_schema`` as
``output_config.format``), so the helpers of ``fake_anthropic`` (``forced_tool``,
``is_structured``, ``user_texts``, ``tool_results``, ``default_responder``, routes, ``on_tool``)
work unchanged; ``.wire`` is the body as sent. A ``tool`` message whose content starts with
``[error] `` (the adapter's marking, the wire has no error flag) reads as ``is_error``.

Failures, as OpenAI-compatible servers send them (``{"error": {"message", "type", "param",
"code"}}``): ``Error.rate_limit`` -> 429 ``rate_limit_exceeded`` with its ``retry-after``;
``Error.spend_limit`` -> 429 ``insufficient_quota``; ``Error.overloaded`` -> 503 "The server is
overloaded"; ``Error.api_error`` -> 5xx ``server_error``; with ``after_text`` on a stream, an
``{"error": ...}`` event after the text. ``unknown_models`` -> 404 ``model_not_found`` (on chat
and on ``/v1/models/{id}``); ``Stall`` hangs then resets, as in the Anthropic fake.

Validation (``strict``), like the real API: a ``tool`` message must answer a ``tool_calls`` id
of the assistant message before it, and every call must be answered; ``tool_choice`` must name
an offered function; ``json_schema`` needs a name and a schema; OpenAI's reasoning models
(``gpt-5*``, ``o1``/``o3``/``o4``) reject ``max_tokens`` (``max_completion_tokens`` instead)
and a ``temperature`` other than 1.

Prompt caching follows OpenAI's documented rule: automatic for prompts of 1024 tokens or more;
``usage.prompt_tokens_details.cached_tokens`` is the longest prefix seen before (same model),
counted from 1024 in 128-token increments. Tokens are the same estimate as the Anthropic fake
(ceil(chars / 4) over tools + system + messages, :func:`estimate_tokens`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .fake_anthropic import (
    Delay, Error, FakeAnthropic, RecordedRequest, Stall, Text, ToolUse, Turn, _Invalid,
    _prompt_pieces, _tokens, estimate_tokens, existing_facts, forced_tool, is_chat,
)

# existing_facts: the extraction contract's input (the user's facts shown to the model) reads
# the same from a converted Chat Completions request as from a Messages one.
__all__ = ["existing_facts", "FakeOpenAI", "OpenAIRecordedRequest", "to_messages_shape", "CACHE_MIN_TOKENS", "CACHE_STEP_TOKENS"]

CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128
ERROR_PREFIX = "[error] "
_REASONING = ("gpt-5", "o1", "o3", "o4")
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "tool_use": "tool_calls",
           "max_tokens": "length", "model_context_window_exceeded": "length", "refusal": "content_filter"}


@dataclass
class OpenAIRecordedRequest(RecordedRequest):
    wire: dict = field(default_factory=dict)    # the Chat Completions body as sent

    @property
    def stream(self) -> bool:
        return bool(self.wire.get("stream"))


# --------------------------------------------------------------------------------------------
# Chat Completions -> the Messages API's shape (what the shared assertions read)
# --------------------------------------------------------------------------------------------


def _parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text")


# The agent sends the volatile context (recalled episodes, then "Today is <date>.") as a text
# block in front of the user's words; the adapter joins a message's text blocks with a newline
# (several compatible servers take no list of parts). Split it back, so the shared helpers
# (``last_user_text``, the echo) read the user's own words on both fakes.
# The context may end with this request's material (who a direct chat is with, the group's
# discussion, a quoted message), fenced or bracketed, before the user's words.
_CONTEXT = re.compile(r"\A((?:<related_episodes>.*?</related_episodes>\n\n)?Today is \d{4}-\d{2}-\d{2}\."
                      r"(?:\n\n(?:\[私聊对象 / you are talking with: [^\n]*\]|<untrusted_content\b.*?</untrusted_content>))*)"
                      r"\n(.+)\Z", re.DOTALL)


def _split_context(text: str) -> Any:
    m = _CONTEXT.match(text)
    if m is None:
        return text
    return [{"type": "text", "text": m.group(1)}, {"type": "text", "text": m.group(2)}]


def to_messages_shape(body: dict) -> dict:
    out: dict[str, Any] = {"model": body.get("model", ""),
                           "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 4096}
    system: list[dict] = []
    messages: list[dict] = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer"):
            system.append({"type": "text", "text": _parts_text(content)})
        elif role == "user":
            if isinstance(content, str):
                blocks: Any = _split_context(content)
            else:
                blocks = []
                for p in content or []:
                    if isinstance(p, dict) and p.get("type") == "text":
                        blocks.append({"type": "text", "text": p.get("text", "")})
                    elif isinstance(p, dict) and p.get("type") == "image_url":
                        blocks.append({"type": "image", "source": {"type": "url",
                                                                    "url": (p.get("image_url") or {}).get("url")}})
            if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list) \
                    and any(b.get("type") == "tool_result" for b in messages[-1]["content"]):
                # text after tool results: one user turn, as on the Messages API
                extra = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
                messages[-1]["content"].extend(extra)
            else:
                messages.append({"role": "user", "content": blocks})
        elif role == "assistant":
            blocks = []
            text = _parts_text(content) if content else ""
            if text:
                blocks.append({"type": "text", "text": text})
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = {"_unparsed": fn.get("arguments")}
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": args})
            messages.append({"role": "assistant",
                             "content": blocks if (m.get("tool_calls") or not isinstance(content, str)) else content})
        elif role == "tool":
            text = _parts_text(content)
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": text}
            if text.startswith(ERROR_PREFIX):
                result["content"] = text[len(ERROR_PREFIX):]
                result["is_error"] = True
            if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list) \
                    and all(b.get("type") == "tool_result" for b in messages[-1]["content"]):
                messages[-1]["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
    if system:
        out["system"] = system
    out["messages"] = messages
    tools = []
    for t in body.get("tools") or []:
        fn = (t or {}).get("function") or {}
        tools.append({"name": fn.get("name"), "description": fn.get("description", ""),
                      "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    elif choice == "required":
        out["tool_choice"] = {"type": "any"}
    elif choice in ("auto", "none"):
        out["tool_choice"] = {"type": choice}
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["output_config"] = {"format": {"type": "json_schema",
                                           "schema": (fmt.get("json_schema") or {}).get("schema") or {}}}
    for k in ("temperature", "top_p", "stream"):
        if k in body:
            out[k] = body[k]
    return out


# --------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------


class FakeOpenAI(FakeAnthropic):
    """Fake OpenAI-compatible Chat Completions API. See the module docstring."""

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__(api_key=api_key)
        self.unknown_models: set[str] = set()
        self.retrieve_route: bool = True        # False: a server with /models but no /models/{id}
        self.cache_min_tokens = CACHE_MIN_TOKENS
        self._prefixes: set[str] = set()

    @property
    def base_url(self) -> str:   # what OPENAI_BASE_URL is set to (the SDK appends /chat/completions)
        return super().base_url + "/v1"

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self._prefixes.clear()

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._h_chat)
        app.router.add_get("/v1/models", self._h_models)
        app.router.add_get("/v1/models/{model_id:.+}", self._h_model_one)
        app.router.add_route("*", "/{tail:.*}", self._h_unknown)
        return app

    # ---- errors, OpenAI's shape ----------------------------------------------------------
    def _error_response(self, err: Error) -> web.Response:
        status, etype, code, message = err.status, err.type, None, err.message
        if err.error_code == "enforced_spend_limit_reached":
            etype = code = "insufficient_quota"
            message = ("You exceeded your current quota, please check your plan and billing details.")
        elif err.type == "rate_limit_error":
            etype, code = "requests", "rate_limit_exceeded"
            message = f"Rate limit reached for requests. {err.message}"
        elif err.status == 529 or err.type == "overloaded_error":
            status, etype, message = 503, "server_error", "The server is overloaded or not ready yet."
        elif err.status >= 500:
            etype = "server_error"
        elif err.status == 401:
            etype, code = "invalid_request_error", "invalid_api_key"
        elif err.status == 404:
            etype, code = "invalid_request_error", err.error_code or "model_not_found"
        headers = {"x-request-id": self._request_id(), **err.headers}
        return web.Response(status=status, content_type="application/json", headers=headers,
                            body=json.dumps({"error": {"message": message, "type": etype, "param": None,
                                                       "code": code}}).encode())

    def _auth_error(self, request: web.Request) -> Error | None:
        bearer = request.headers.get("authorization", "")
        if not bearer.startswith("Bearer "):
            return Error(401, "invalid_request_error", "You didn't provide an API key.")
        if self.api_key is not None and bearer != f"Bearer {self.api_key}":
            return Error(401, "invalid_request_error", "Incorrect API key provided.")
        return None

    def _not_found(self, model: str) -> Error:
        return Error(404, "invalid_request_error",
                     f"The model `{model}` does not exist or you do not have access to it.",
                     error_code="model_not_found")

    async def _h_unknown(self, request: web.Request) -> web.Response:
        return self._error_response(Error(404, "invalid_request_error",
                                          f"Not found: {request.method} {request.path} (fake openai)",
                                          error_code="unknown_url"))

    async def _h_models(self, request: web.Request) -> web.Response:
        err = self._auth_error(request)
        if err is not None:
            return self._error_response(err)
        with self._lock:
            seen = sorted({r.model for r in self._requests if r.model} - self.unknown_models)
        data = [{"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"}
                for m in sorted({*seen, "gpt-4o", "gpt-4o-mini"} - self.unknown_models)]
        return web.json_response({"object": "list", "data": data})

    async def _h_model_one(self, request: web.Request) -> web.Response:
        if not self.retrieve_route:
            return await self._h_unknown(request)
        err = self._auth_error(request)
        if err is not None:
            return self._error_response(err)
        model = request.match_info["model_id"]
        if model in self.unknown_models:
            return self._error_response(self._not_found(model))
        return web.json_response({"id": model, "object": "model", "created": 1700000000, "owned_by": "fake"})

    # ---- chat completions ----------------------------------------------------------------
    async def _h_chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if isinstance(body, Error):
            return self._error_response(body)
        norm = to_messages_shape(body)
        rec = OpenAIRecordedRequest(
            json=norm, headers=dict(request.headers), at=time.time(), path=request.path,
            kind="chat" if is_chat(norm) else ("tool" if forced_tool(norm) else "structured"),
            tool=forced_tool(norm), input_tokens=estimate_tokens(norm), wire=body,
        )
        with self._lock:
            self._requests.append(rec)
        if self.latency > 0 and await self._park(self.latency):
            return web.Response(status=503)
        problem = self._auth_error(request)
        if problem is None and body.get("model") in self.unknown_models:
            problem = self._not_found(body.get("model"))
        if problem is None and self.strict:
            try:
                self._validate_openai(body)
            except _Invalid as exc:
                problem = Error.invalid_request(str(exc))
        if problem is not None:
            rec.answered_with, rec.source = "Error", "validation"
            return self._error_response(problem)
        try:
            response, source = self._choose(norm, rec.kind)
        except Exception:
            import traceback

            with self._lock:
                self.internal_errors.append(traceback.format_exc())
            response, source = Error.api_error(), "responder-crash"
        rec.source = source
        while True:
            if isinstance(response, Delay):
                if await self._park(response.seconds):
                    return web.Response(status=503)
                response = response.inner
                continue
            if callable(response) and not isinstance(response, (Text, ToolUse, Turn, Error, Stall)):
                response = response(norm)
                continue
            break
        rec.answered_with = type(response).__name__
        return await self._answer_openai(request, body, norm, response)

    def _validate_openai(self, body: dict) -> None:
        for fld in ("model", "messages"):
            if fld not in body:
                raise _Invalid(f"Missing required parameter: '{fld}'.")
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise _Invalid("[] is too short - 'messages'")
        model = str(body.get("model"))
        if model.startswith(_REASONING):
            if "max_tokens" in body:
                raise _Invalid("Unsupported parameter: 'max_tokens' is not supported with this model. "
                               "Use 'max_completion_tokens' instead.")
            if body.get("temperature") not in (None, 1, 1.0):
                raise _Invalid("Unsupported value: 'temperature' does not support 0.0 with this model. "
                               "Only the default (1) value is supported.")
        names = [((t or {}).get("function") or {}).get("name") for t in body.get("tools") or []]
        if len(set(names)) != len(names):
            raise _Invalid("tools: function names must be unique")
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in names:
                raise _Invalid(f"Invalid value for 'tool_choice': function '{name}' is not in 'tools'.")
        elif choice == "required" and not names:
            raise _Invalid("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
                           "are specified.")
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            js = fmt.get("json_schema") or {}
            if not js.get("name") or not isinstance(js.get("schema"), dict):
                raise _Invalid("Missing required parameter: 'response_format.json_schema.name'.")
        pending: list[str] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise _Invalid(f"Invalid value for 'messages[{i}].role'.")
            role = m["role"]
            if role == "tool":
                if m.get("tool_call_id") not in pending:
                    raise _Invalid(f"Invalid parameter: messages with role 'tool' must be a response to a "
                                   f"preceeding message with 'tool_calls'. (messages[{i}])")
                pending.remove(m["tool_call_id"])
                continue
            if pending:
                raise _Invalid("An assistant message with 'tool_calls' must be followed by tool messages "
                               f"responding to each 'tool_call_id'. The following tool_call_ids did not have "
                               f"response messages: {', '.join(pending)}")
            if role == "assistant":
                pending = [c.get("id") for c in m.get("tool_calls") or []]
                if m.get("content") is None and not pending:
                    raise _Invalid(f"Invalid value for 'messages[{i}].content': expected a string, got null.")
            elif m.get("content") is None:
                raise _Invalid(f"Invalid value for 'messages[{i}].content': expected a string, got null.")
        if pending:
            raise _Invalid("An assistant message with 'tool_calls' must be followed by tool messages "
                           f"responding to each 'tool_call_id'. The following tool_call_ids did not have "
                           f"response messages: {', '.join(pending)}")

    # ---- answering ----------------------------------------------------------------------
    def _cached_tokens(self, norm: dict) -> int:
        """OpenAI's rule: the longest prefix seen before, 1024 tokens or more, in steps of 128."""
        text = "\x00".join(t for t, _ in _prompt_pieces(norm))
        total = _tokens(len(text))
        if total < self.cache_min_tokens:
            return 0
        model = norm.get("model", "")
        keys = []
        n = self.cache_min_tokens
        while n <= total:
            keys.append((n, hashlib.sha256((model + "\x00" + text[: n * 4]).encode()).hexdigest()))
            n += CACHE_STEP_TOKENS
        with self._lock:
            hit = max((n for n, k in keys if k in self._prefixes), default=0)
            self._prefixes.update(k for _, k in keys)
        return hit

    def _usage_openai(self, norm: dict, output_tokens: int) -> dict:
        prompt = estimate_tokens(norm)
        cached = min(self._cached_tokens(norm), prompt)
        return {"prompt_tokens": prompt, "completion_tokens": output_tokens,
                "total_tokens": prompt + output_tokens,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}

    @staticmethod
    def _call_id(block: dict) -> str:
        bid = block.get("id") or ""
        return "call_" + bid[len("toolu_"):] if bid.startswith("toolu_") else bid

    async def _answer_openai(self, request: web.Request, body: dict, norm: dict,
                             response: Any) -> web.StreamResponse:
        stream = bool(body.get("stream"))
        if isinstance(response, Error) and (response.after_text is None or not stream):
            return self._error_response(response)
        if isinstance(response, Stall) and (not stream or (response.seconds <= 0 and not response.after_text)):
            await self._park(response.seconds)
            self._drop_connection(request)
            return web.Response(status=503)
        if isinstance(response, (Error, Stall)):
            blocks, stop = [{"type": "text", "text": response.after_text or ""}], None
        else:
            blocks, stop = self._content(response)
        usage = self._usage_openai(norm, self._output_tokens(blocks))
        cid = f"chatcmpl-fake{next(self._ids)}"
        created = int(time.time())
        model = body.get("model")
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        calls = [{"id": self._call_id(b), "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}}
                 for b in blocks if b["type"] == "tool_use"]
        finish = _FINISH.get(stop or "end_turn", "stop")
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            return web.json_response({
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": "fp_fake", "service_tier": "default",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            "x-request-id": self._request_id()})
        await resp.prepare(request)

        async def send(delta: dict | None, finish_reason: str | None = None, *, choices: bool = True,
                       with_usage: dict | None = None) -> None:
            chunk: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                                     "model": model, "system_fingerprint": "fp_fake", "service_tier": "default",
                                     "choices": [{"index": 0, "delta": delta or {}, "logprobs": None,
                                                  "finish_reason": finish_reason}] if choices else []}
            if include_usage:
                chunk["usage"] = with_usage
            await resp.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
            if self.stream_delay > 0:
                await self._park(self.stream_delay)

        try:
            await send({"role": "assistant", "content": "", "refusal": None})
            for piece in self._split(text):
                await send({"content": piece})
            for index, call in enumerate(calls):
                await send({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                            "function": {"name": call["function"]["name"], "arguments": ""}}]})
                for piece in self._split(call["function"]["arguments"]) or [""]:
                    await send({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            if isinstance(response, Stall):
                await self._park(response.seconds)
                self._drop_connection(request)
                return resp
            if isinstance(response, Error):
                err = json.loads(self._error_response(response).body)
                await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                await resp.write_eof()
                return resp
            await send({}, finish)
            if include_usage:
                await send(None, choices=False, with_usage=usage)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away mid-stream
        return resp

