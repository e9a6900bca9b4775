"""The Anthropic adapter: the model port over the Messages API (``anthropic`` SDK).

One ``AsyncAnthropic`` client per provider, on the SDK's aiohttp transport; streamed turns
whose raw event stream we accumulate ourselves; our own retry/deadline policy
(``bot.llm.policy``). The port's ``"cache": True`` marker becomes
``cache_control: {"type": "ephemeral"}``; a block already carrying ``cache_control`` keeps it.
The offline model (``bot/offline/server.py``) speaks this wire format, so it is served
through this adapter too.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from typing import Any

import anthropic

from bot.llm.policy import (
    StructuredModes, json_instruction, log, parse_json_object, parse_retry_after, policy_turn,
    NO_ROUTES, refused_cause,
)
from memory.llm import (
    ModelFailure, ModelRequest, ModelResponse, OnText, StopReason, Usage,
)
from memory.models import caps, effective_model

_SPEND_HINTS = ("usage limit", "spend limit", "credit balance", "billing", "quota", "spending")
# 400 texts that mean "this model does not take that way of asking for structure"
_REJECTS = {"tool": ("tool_choice",), "structured": ("output_config", "output_format", "json_schema")}
_STOPS = {s.value: s for s in StopReason}


def classify(exc: BaseException) -> ModelFailure:
    if isinstance(exc, ModelFailure):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        retry_after = parse_retry_after(getattr(exc.response, "headers", None),
                                        ("retry-after", "anthropic-ratelimit-requests-reset"))
        text = _error_text(exc)
        if isinstance(exc, anthropic.RateLimitError):
            spend_cls = getattr(anthropic, "EnforcedSpendLimitReachedError", None)
            if (spend_cls is not None and isinstance(exc, spend_cls)) \
                    or "spend_limit" in str(getattr(exc, "error_code", "") or "") \
                    or any(h in text.lower() for h in _SPEND_HINTS):
                return ModelFailure("spend_limit", text, 429)
            return ModelFailure("rate_limited", text, 429, retry_after)
        status = exc.status_code
        if status == 529 or "overloaded" in text.lower():
            return ModelFailure("overloaded", text, status)
        if status >= 500:
            return ModelFailure("server", text, status)
        if status == 402:
            return ModelFailure("spend_limit", text, 402)
        if status in (401, 403):
            return ModelFailure("auth", text, status)
        if status == 404:
            return ModelFailure("not_found", text, status)
        return ModelFailure("bad_request", text, status)
    refused = refused_cause(exc)
    if refused:                 # a misspelt host or a closed port: not a timeout (issue 52)
        return ModelFailure("connection", refused)
    if isinstance(exc, (anthropic.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return ModelFailure("timeout", str(exc) or type(exc).__name__)
    if isinstance(exc, anthropic.APIConnectionError):
        return ModelFailure("connection", str(exc))
    # A timeout while reading a stream escapes the SDK as the transport's own exception.
    if "Timeout" in type(exc).__name__:
        return ModelFailure("timeout", repr(exc))
    if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "aiohttp"):
        return ModelFailure("connection", repr(exc))
    return ModelFailure("server", repr(exc))


def _error_text(e: anthropic.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(e.message or e)


def make_client(*, api_key: str, base_url: str | None, stall_timeout: float = 30.0) -> anthropic.AsyncAnthropic:
    """One client per provider: pooled connections, explicit timeout, our own retries.

    The SDK's aiohttp transport (``DefaultAioHttpClient``, vendored in the SDK, aiohttp is
    ours already) instead of httpx's own: ~25 % less client CPU per streamed call, measured
    in bench/README.md. The read timeout still bounds a stalled stream (aiohttp sock_read)."""
    timeout = anthropic.Timeout(connect=10.0, read=stall_timeout, write=30.0, pool=10.0)
    return anthropic.AsyncAnthropic(
        api_key=api_key or "offline",
        base_url=base_url or None,
        timeout=timeout,
        max_retries=0,
        http_client=anthropic.DefaultAioHttpClient(timeout=timeout),
    )


# -- port -> wire ------------------------------------------------------------------------------
def _cached(block: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    if block.get("cache") or "cache_control" in block:
        out["cache_control"] = block.get("cache_control") or {"type": "ephemeral"}
    return out


def wire_block(b: dict[str, Any]) -> dict[str, Any] | None:
    t = b.get("type")
    if t == "text":
        return _cached(b, {"type": "text", "text": b.get("text", "")})
    if t == "image":
        if not b.get("data"):
            return _cached(b, {"type": "text", "text": "[image]"})
        return _cached(b, {"type": "image", "source": {"type": "base64", "media_type": b.get("media_type", "image/png"),
                                                       "data": b["data"]}})
    if t == "tool_use":
        return _cached(b, {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b.get("input") or {}})
    if t == "tool_result":
        out = {"type": "tool_result", "tool_use_id": b["tool_use_id"], "content": b.get("content", "")}
        if b.get("is_error"):
            out["is_error"] = True
        return _cached(b, out)
    return None


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [w for w in (wire_block(b) for b in content) if w is not None]
        out.append({"role": m["role"], "content": content})
    return out


def wire_system(system: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_cached(b, {"type": "text", "text": b.get("text", "")}) for b in system if b.get("text")]


def to_wire(system: list[dict[str, Any]], messages: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The request's system blocks and messages as the Messages API takes them: the port's
    ``"cache": True`` as ``cache_control``, images as base64 sources; copies (the caller's
    blocks are left alone)."""
    return wire_system(system), wire_messages(messages)


class AnthropicChatModel:
    """``ChatModel`` over the Messages API."""

    def __init__(self, client: anthropic.AsyncAnthropic, model: str, *, provider: str = "anthropic",
                 max_tokens: int = 2048, modes: StructuredModes | None = None) -> None:
        today = dt.date.today().isoformat()
        self.configured = model
        self.name = effective_model(model, today)
        if self.name != model:
            log.warning("model.retired", configured=model, using=self.name)
        self.provider = provider
        self.client = client
        self.max_tokens = max_tokens
        self.modes = modes or StructuredModes()

    def with_model(self, model: str) -> "AnthropicChatModel":
        """The same provider and client, another model (the routed consolidation model)."""
        return AnthropicChatModel(self.client, model, provider=self.provider, max_tokens=self.max_tokens,
                                  modes=self.modes)

    async def turn(self, request: ModelRequest, *, on_text: OnText | None = None,
                   deadline: float) -> ModelResponse:
        """One model turn, streamed; 429s are retried (honouring retry-after) until ``deadline``."""
        return await policy_turn(lambda mode: self._stream(request, on_text, mode),
                                 structured=request.structured is not None, modes=self.modes,
                                 rejects=_REJECTS, deadline=deadline, classify=classify, model=self.name)

    def _kwargs(self, request: ModelRequest, mode: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(model=self.name, max_tokens=request.max_tokens or self.max_tokens,
                                      system=wire_system(request.system),
                                      messages=wire_messages(request.messages))
        tools = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                 for t in request.tools]
        if request.temperature is not None and caps(self.name).sampling_params:
            # this SDK generation has no typed sampling parameters; the API still takes them
            kwargs["extra_body"] = {"temperature": request.temperature}
        so = request.structured
        if so is not None:
            if mode == "tool":
                tools = [*tools, {"name": so.name, "description": so.description, "input_schema": so.schema}]
                kwargs["tool_choice"] = {"type": "tool", "name": so.name}
            elif mode == "structured":
                kwargs["output_config"] = {"format": {"type": "json_schema", "schema": so.schema}}
            else:
                system = list(kwargs["system"])
                instruction = json_instruction(so.name, so.schema)
                if system:
                    system[-1] = {**system[-1], "text": system[-1]["text"] + instruction}
                else:
                    system = [{"type": "text", "text": instruction.strip()}]
                kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools
        if isinstance(kwargs["system"], list) and len(kwargs["system"]) == 1 \
                and "cache_control" not in kwargs["system"][0]:
            kwargs["system"] = kwargs["system"][0]["text"]   # one plain block: send the string
        return kwargs

    async def _stream(self, request: ModelRequest, on_text: OnText | None, mode: str | None) -> ModelResponse:
        kwargs = self._kwargs(request, mode)
        # The raw event stream, accumulated here: the SDK's MessageStream also rebuilds a
        # snapshot model on every event, ~25 % of a streamed call's client CPU (bench/README.md).
        blocks: list[dict[str, Any]] = []
        json_parts: dict[int, list[str]] = {}
        text = ""
        stop_reason: str | None = None
        model = self.name
        usage = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0}
        stream = await self.client.messages.create(stream=True, **kwargs)
        async with stream:
            async for ev in stream:
                kind = ev.type
                if kind == "content_block_delta":
                    delta = ev.delta
                    if delta.type == "text_delta":
                        blocks[ev.index]["text"] = blocks[ev.index].get("text", "") + delta.text
                        text += delta.text
                        if on_text is not None and delta.text:
                            await on_text(text)
                    elif delta.type == "input_json_delta":
                        json_parts.setdefault(ev.index, []).append(delta.partial_json)
                elif kind == "content_block_start":
                    while len(blocks) <= ev.index:
                        blocks.append({})
                    cb = ev.content_block
                    if cb.type == "text":
                        blocks[ev.index] = {"type": "text", "text": cb.text or ""}
                    elif cb.type == "tool_use":
                        blocks[ev.index] = {"type": "tool_use", "id": cb.id, "name": cb.name,
                                            "input": dict(cb.input or {})}
                    # thinking / server tool blocks are not part of the port's content
                elif kind == "content_block_stop":
                    raw = "".join(json_parts.pop(ev.index, []))
                    if raw and blocks[ev.index]:
                        blocks[ev.index]["input"] = json.loads(raw)
                elif kind == "message_start":
                    model = ev.message.model or model
                    _take_usage(usage, ev.message.usage)
                elif kind == "message_delta":
                    stop_reason = ev.delta.stop_reason or stop_reason
                    _take_usage(usage, ev.usage)
        content = [b for b in blocks if b]
        stop = _STOPS.get(stop_reason or "end_turn")
        if stop is None:
            log.warning("model.unknown_stop_reason", model=self.name, stop_reason=stop_reason)
            stop = StopReason.END_TURN
        structured = None
        so = request.structured
        if so is not None:
            if mode == "tool":
                structured = next((b["input"] for b in content if b.get("type") == "tool_use"
                                   and b.get("name") == so.name and isinstance(b.get("input"), dict)), None)
                content = [b for b in content if not (b.get("type") == "tool_use" and b.get("name") == so.name)]
                if structured is not None and stop is StopReason.TOOL_USE:
                    stop = StopReason.END_TURN
            else:
                structured = parse_json_object(text)
        return ModelResponse(
            content=content, stop_reason=stop, model=model, provider=self.provider,
            usage=Usage(usage["input_tokens"], usage["output_tokens"], usage["cache_read_input_tokens"],
                        usage["cache_creation_input_tokens"]),
            structured=structured)

    async def check(self) -> None:
        """Start-up probe (no tokens spent): the key, the endpoint and the model id, via
        ``GET /v1/models/{id}``. Raises ModelFailure (auth / not_found / connection / …)."""
        try:
            await asyncio.wait_for(self.client.models.retrieve(self.name), 10.0)
        except Exception as e:  # noqa: BLE001
            failure = classify(e)
            # Anthropic's unknown model is "model: <id>"; a 404 that names no model (paths set
            # aside) is a wrong base URL (ANTHROPIC_BASE_URL with /v1: /v1/v1/models/…), not
            # ETHAN_MODEL (issue 52)
            if failure.kind == "not_found" and "model" not in re.sub(r"\S*/\S*", "", failure.detail).lower():
                raise ModelFailure("not_found", f"{NO_ROUTES}: {failure.detail[:120]}", 404) from e
            raise failure from e

    async def aclose(self) -> None:
        await self.client.close()


def _take_usage(usage: dict[str, int], u: Any) -> None:
    if u is None:
        return
    for k in usage:
        v = getattr(u, k, None)
        if v:
            usage[k] = v
