"""The OpenAI-compatible adapter: the model port over Chat Completions (official ``openai`` SDK).

Every OpenAI-compatible endpoint (OpenAI, DeepSeek, Qwen/DashScope, Doubao/Ark, Kimi, GLM,
Gemini's compatible endpoint, Ollama, vLLM) takes the same request: ``messages`` with a
``system`` message, ``tools`` as functions, ``tool_calls`` on assistant messages and ``tool``
messages for the results; streamed as ``chat.completion.chunk`` events whose
``delta.tool_calls`` carry a function's name and its arguments in pieces by ``index``.

Translation (port -> wire):

- system text blocks -> one ``system`` message (joined; the stable part first, so the
  provider's automatic prefix cache finds it). ``"cache": True`` is stripped: these
  providers cache prefixes by themselves and report ``prompt_tokens_details.cached_tokens``
  (DeepSeek: ``prompt_cache_hit_tokens``).
- a ``tool_result`` block -> a ``tool`` message (``tool_call_id``); the wire has no error
  flag, so an ``is_error`` result's content starts with ``[error] `` (what the model reads).
- structured output (the consolidator) -> a forced function (``tool_choice`` naming it),
  ``response_format: json_schema``, or a plain JSON instruction, per ``memory.models.caps``
  and what a 400 taught us (``StructuredModes``).

finish_reason -> StopReason: ``stop`` -> end_turn (tool_use when the turn did call tools:
some servers say ``stop`` there), ``length`` -> max_tokens, ``tool_calls``/``function_call``
-> tool_use, ``content_filter`` -> refusal.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from bot.llm.policy import (
    NO_ROUTES,
    refused_cause,
    StructuredModes, json_instruction, log, parse_json_object, parse_retry_after, policy_turn,
)
from memory.llm import ModelFailure, ModelRequest, ModelResponse, OnText, StopReason, Usage
from memory.models import caps

ERROR_PREFIX = "[error] "
_SPEND_CODES = ("insufficient_quota", "billing_hard_limit_reached", "insufficient_balance")
_SPEND_HINTS = ("exceeded your current quota", "insufficient balance", "billing", "quota exceeded",
                "arrearage", "spend limit", "usage limit")
_REJECTS = {"tool": ("tool_choice", "tool choice", "function calling"),
            "structured": ("response_format", "json_schema", "structured output")}
FINISH = {
    "stop": StopReason.END_TURN,
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "content_filter": StopReason.REFUSAL,
    "sensitive": StopReason.REFUSAL,          # GLM: stopped by its content review
}
# finish reasons that mean the server gave up mid-answer (GLM, DeepSeek): a failure, which a
# fallback model may answer
FINISH_FAILED = {"network_error": "server", "insufficient_system_resource": "overloaded"}


def classify(exc: BaseException) -> ModelFailure:
    if isinstance(exc, ModelFailure):
        return exc
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        text = _error_text(exc)
        code = str(_error_field(exc, "code") or "") + " " + str(_error_field(exc, "type") or "")
        low = text.lower()
        if status == 429:
            if any(c in code for c in _SPEND_CODES) or any(h in low for h in _SPEND_HINTS):
                return ModelFailure("spend_limit", text, 429)
            headers = getattr(exc.response, "headers", None)
            wait = parse_retry_after(headers, ("retry-after",))
            if wait is None:
                ms = parse_retry_after(headers, ("retry-after-ms",))
                wait = None if ms is None else ms / 1000
            return ModelFailure("rate_limited", text, 429, wait)
        if status == 402 or any(c in code for c in _SPEND_CODES):
            return ModelFailure("spend_limit", text, status)
        if status == 529 or "overloaded" in low:
            return ModelFailure("overloaded", text, status)
        if status >= 500:
            return ModelFailure("server", text, status)
        if status in (401, 403):
            return ModelFailure("auth", text, status)
        if status == 404:
            return ModelFailure("not_found", text, status)
        return ModelFailure("bad_request", text, status)
    refused = refused_cause(exc)
    if refused:
        # The SDK's aiohttp transport files a refused connect under APITimeoutError
        # (httpx2.ConnectTimeout): the cause says what happened, in milliseconds, not a timeout.
        return ModelFailure("connection", refused)
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return ModelFailure("timeout", str(exc) or type(exc).__name__)
    if isinstance(exc, openai.APIConnectionError):
        return ModelFailure("connection", str(exc))
    if isinstance(exc, openai.APIError):
        # an error event inside a 200 stream
        text = str(getattr(exc, "message", "") or exc)
        return ModelFailure("overloaded" if "overload" in text.lower() else "server", text)
    if "Timeout" in type(exc).__name__:
        return ModelFailure("timeout", repr(exc))
    if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "aiohttp"):
        return ModelFailure("connection", repr(exc))
    return ModelFailure("server", repr(exc))


def _error_field(exc: openai.APIStatusError, name: str) -> Any:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return err.get(name)
    return getattr(exc, name, None)


def _error_text(exc: openai.APIStatusError) -> str:
    msg = _error_field(exc, "message")
    return str(msg) if msg else str(exc.message or exc)


def make_client(*, api_key: str, base_url: str | None, stall_timeout: float = 30.0) -> openai.AsyncOpenAI:
    """One client per provider: the SDK's aiohttp transport (aiohttp is ours already), an
    explicit timeout (the read timeout bounds a stalled stream) and no SDK retries."""
    timeout = openai.Timeout(connect=10.0, read=stall_timeout, write=30.0, pool=10.0)
    return openai.AsyncOpenAI(
        api_key=api_key or "none",      # Ollama / vLLM take any key; the SDK insists on one
        base_url=base_url or None,
        timeout=timeout,
        max_retries=0,
        http_client=openai.DefaultAioHttpClient(timeout=timeout),
    )


# -- port -> wire ------------------------------------------------------------------------------
def _text_of(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text" and b.get("text"))


def wire_messages(system: list[dict[str, Any]], messages: list[dict[str, Any]],
                  extra_system: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sys_text = "\n\n".join(b.get("text", "") for b in system if b.get("text")) + extra_system
    if sys_text.strip():
        out.append({"role": "system", "content": sys_text.strip()})
    for m in messages:
        content = m["content"]
        role = m["role"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _text_of(content) or None}
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"],
                                   "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
                     for b in content if b.get("type") == "tool_use"]
            if calls:
                msg["tool_calls"] = calls
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
            continue
        # user: tool results first (they must follow the assistant's tool_calls), then the rest
        for b in content:
            if b.get("type") == "tool_result":
                body = b.get("content", "")
                if not isinstance(body, str):
                    body = _text_of(body) if isinstance(body, list) else str(body)
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": (ERROR_PREFIX + body) if b.get("is_error") else body})
        rest = [b for b in content if b.get("type") in ("text", "image")]
        if not rest:
            continue
        if all(b["type"] == "text" for b in rest):
            # a plain string: several compatible servers take no list of parts
            out.append({"role": "user", "content": _text_of(rest)})
            continue
        parts: list[dict[str, Any]] = []
        for b in rest:
            if b["type"] == "text":
                parts.append({"type": "text", "text": b.get("text", "")})
            elif b.get("data"):
                parts.append({"type": "image_url", "image_url": {
                    "url": f"data:{b.get('media_type', 'image/png')};base64,{b['data']}"}})
            else:
                parts.append({"type": "text", "text": "[image]"})
        out.append({"role": "user", "content": parts})
    return out


def _tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


class OpenAIChatModel:
    """``ChatModel`` over an OpenAI-compatible Chat Completions endpoint."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, *, provider: str = "openai",
                 max_tokens: int = 2048, modes: StructuredModes | None = None) -> None:
        self.name = model
        self.provider = provider
        self.client = client
        self.max_tokens = max_tokens
        self.modes = modes or StructuredModes()

    def with_model(self, model: str) -> "OpenAIChatModel":
        return OpenAIChatModel(self.client, model, provider=self.provider, max_tokens=self.max_tokens,
                               modes=self.modes)

    async def turn(self, request: ModelRequest, *, on_text: OnText | None = None,
                   deadline: float) -> ModelResponse:
        return await policy_turn(lambda mode: self._stream(request, on_text, mode),
                                 structured=request.structured is not None, modes=self.modes,
                                 rejects=_REJECTS, deadline=deadline, classify=classify, model=self.name)

    def _kwargs(self, request: ModelRequest, mode: str | None) -> dict[str, Any]:
        c = caps(self.name)
        so = request.structured
        extra_system = json_instruction(so.name, so.schema) if so is not None and mode == "json" else ""
        kwargs: dict[str, Any] = {
            "model": self.name,
            "messages": wire_messages(request.system, request.messages, extra_system),
            "stream": True,
            "stream_options": {"include_usage": True},
            c.max_tokens_field: request.max_tokens or self.max_tokens,
        }
        tools = [_tool(t.name, t.description, t.input_schema) for t in request.tools]
        if request.temperature is not None and c.sampling_params:
            kwargs["temperature"] = request.temperature
        if so is not None:
            if mode == "tool":
                tools.append(_tool(so.name, so.description, so.schema))
                kwargs["tool_choice"] = {"type": "function", "function": {"name": so.name}}
            elif mode == "structured":
                kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": so.name, "description": so.description, "schema": so.schema, "strict": True}}
        if tools:
            kwargs["tools"] = tools
        return kwargs

    async def _stream(self, request: ModelRequest, on_text: OnText | None, mode: str | None) -> ModelResponse:
        body = self._kwargs(request, mode)
        text = ""
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        model = self.name
        usage = Usage()
        # The raw SSE lines, parsed here (as the Anthropic adapter reads its raw events): the
        # SDK would transform the whole request through its TypedDicts and build a pydantic
        # chunk model per event, ~2.6× our own client CPU per streamed call (bench/README.md,
        # §9). The body goes as extra_body (sent as given); errors before the stream are the
        # SDK's APIStatusError as usual, an error event inside it is ours to raise.
        async with self.client.chat.completions.with_streaming_response.create(
                model=body.pop("model"), messages=[], extra_body=body) as response:
            async for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                    msg = str(err.get("message") or "an error event in the stream")
                    kind = "overloaded" if "overload" in msg.lower() else "rate_limited" \
                        if "rate" in str(err.get("code") or err.get("type") or "") else "server"
                    raise ModelFailure(kind, msg)
                model = chunk.get("model") or model
                if chunk.get("usage"):
                    usage = _usage_dict(chunk["usage"])
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or delta.get("refusal")
                    if piece:
                        text += piece
                        if on_text is not None:
                            await on_text(text)
                    for tc in delta.get("tool_calls") or ():
                        index = tc.get("index")
                        slot = calls.setdefault(index if index is not None else len(calls),
                                                {"id": "", "name": "", "args": []})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot["name"] += fn["name"]
                        if fn.get("arguments"):
                            slot["args"].append(fn["arguments"])
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for i in sorted(calls):
            slot = calls[i]
            raw = "".join(slot["args"]).strip()
            try:
                args = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                # The tool runner answers a bad argument with an is_error result; keep the turn.
                args = {"_unparsed_arguments": raw[:2000]}
            if not isinstance(args, dict):
                args = {"_unparsed_arguments": raw[:2000]}
            content.append({"type": "tool_use", "id": slot["id"] or f"call_{i}", "name": slot["name"],
                            "input": args})
        if finish in FINISH_FAILED:
            raise ModelFailure(FINISH_FAILED[finish], f"the stream ended with finish_reason={finish}")
        stop = FINISH.get(finish or "stop")
        if stop is None:
            log.warning("model.unknown_stop_reason", model=self.name, finish_reason=finish)
            stop = StopReason.END_TURN
        if calls and stop is StopReason.END_TURN:
            stop = StopReason.TOOL_USE
        structured = None
        so = request.structured
        if so is not None:
            if mode == "tool":
                structured = next((b["input"] for b in content if b.get("type") == "tool_use"
                                   and b.get("name") == so.name and "_unparsed_arguments" not in b["input"]),
                                  None)
                content = [b for b in content if not (b.get("type") == "tool_use" and b.get("name") == so.name)]
                if structured is not None and stop is StopReason.TOOL_USE:
                    stop = StopReason.END_TURN
            else:
                structured = parse_json_object(text)
        return ModelResponse(content=content, stop_reason=stop, model=model, provider=self.provider,
                             usage=usage, structured=structured)

    async def check(self) -> None:
        """Start-up probe (no tokens spent): ``GET /models/{id}``; where a server has no such
        route, its model list. Raises ModelFailure (auth / not_found / connection / …)."""
        try:
            await asyncio.wait_for(self.client.models.retrieve(self.name), 10.0)
            return
        except Exception as e:  # noqa: BLE001
            failure = classify(e)
            if failure.kind != "not_found":
                raise failure from e
            code = str(_error_field(e, "code") or "").lower() if isinstance(e, openai.APIStatusError) else ""
            about_model = "model" in code + failure.detail.lower()
        # Some servers have no GET /models/{id}: look in the list. Only a 404 about the model
        # itself makes a missing entry a problem — a server whose list leaves out what it
        # serves (an Ark endpoint id, an alias) must not be reported as misconfigured.
        try:
            page = await asyncio.wait_for(self.client.models.list(), 10.0)
            ids = {m.id for m in page.data}
        except Exception as e:  # noqa: BLE001
            failure = classify(e)
            if failure.kind != "not_found":
                raise failure from e
            if "model" not in code:
                # both model routes 404 and nothing says which model: the base URL is wrong
                # (OPENAI_BASE_URL without /v1), not ETHAN_MODEL — and not "unverified", ok
                raise ModelFailure("not_found", f"{NO_ROUTES}: GET /models: {failure.detail[:120]}", 404) from e
            ids = set()
        if self.name in ids or f"models/{self.name}" in ids:
            return
        if about_model:
            raise ModelFailure("not_found", f"the model {self.name!r} is not offered by this endpoint", 404)
        log.info("model.check_unverified", model=self.name, provider=self.provider)

    async def aclose(self) -> None:
        await self.client.close()


def _usage_dict(u: dict[str, Any]) -> Usage:
    prompt = int(u.get("prompt_tokens") or 0)
    completion = int(u.get("completion_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if not cached and u.get("prompt_cache_hit_tokens"):     # DeepSeek's names
        cached = int(u["prompt_cache_hit_tokens"] or 0)
    return Usage(input_tokens=max(0, prompt - cached), output_tokens=completion, cache_read_tokens=cached)
