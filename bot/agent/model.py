"""The chat model: one AsyncAnthropic client, streamed turns, and what failures mean.

The SDK's own retries are off (``max_retries=0``): the retry policy is ours, because it
must respect the per-reply deadline and must not retry a spend-limit 429. Every failure
becomes a ``ModelFailure`` with a kind the agent turns into one short apology.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

import anthropic

from bot.log import get_logger
from memory.models import effective_model

log = get_logger("ethan.model")

OnText = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ModelTurn:
    content: list[dict[str, Any]]     # content blocks as dicts (text, tool_use)
    stop_reason: str
    model: str
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]


class ModelFailure(Exception):
    """kind: rate_limited | spend_limit | overloaded | server | timeout | connection | bad_request."""

    def __init__(self, kind: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.status = status


class ChatModel(Protocol):
    name: str

    async def turn(self, *, system: list[dict], messages: list[dict], tools: list[dict],
                   on_text: OnText | None, deadline: float) -> ModelTurn: ...


_SPEND_HINTS = ("usage limit", "spend limit", "credit balance", "billing", "quota", "spending")


def classify(exc: BaseException) -> ModelFailure:
    if isinstance(exc, ModelFailure):
        return exc
    if isinstance(exc, anthropic.RateLimitError):
        msg = str(exc).lower()
        spend_cls = getattr(anthropic, "EnforcedSpendLimitReachedError", None)
        if (spend_cls is not None and isinstance(exc, spend_cls)) \
                or "spend_limit" in str(getattr(exc, "error_code", "") or "") \
                or any(h in msg for h in _SPEND_HINTS):
            return ModelFailure("spend_limit", str(exc), 429)
        return ModelFailure("rate_limited", str(exc), 429)
    if isinstance(exc, anthropic.APIStatusError):
        if exc.status_code == 529 or "overloaded" in str(exc).lower():
            return ModelFailure("overloaded", str(exc), exc.status_code)
        if exc.status_code >= 500:
            return ModelFailure("server", str(exc), exc.status_code)
        if exc.status_code == 402:
            return ModelFailure("spend_limit", str(exc), 402)
        return ModelFailure("bad_request", str(exc), exc.status_code)
    if isinstance(exc, (anthropic.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return ModelFailure("timeout", str(exc))
    if isinstance(exc, anthropic.APIConnectionError):
        return ModelFailure("connection", str(exc))
    # A timeout while reading a stream escapes the SDK as the transport's own exception.
    if "Timeout" in type(exc).__name__:
        return ModelFailure("timeout", repr(exc))
    if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
        return ModelFailure("connection", repr(exc))
    return ModelFailure("server", repr(exc))


def retry_after_seconds(exc: BaseException) -> float | None:
    resp = getattr(exc, "response", None)
    if resp is None:
        return None
    for name in ("retry-after", "anthropic-ratelimit-requests-reset"):
        v = resp.headers.get(name)
        if v:
            try:
                return max(0.0, float(v))
            except ValueError:
                continue
    return None


def to_wire(system: list[dict], messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """The port's prompt-cache marker (``"cache": True``, memory/llm.py) as Anthropic's
    ``cache_control: {"type": "ephemeral"}``; copies, the caller's blocks are left alone."""
    def block(b: Any) -> Any:
        if not isinstance(b, dict) or "cache" not in b:
            return b
        out = {k: v for k, v in b.items() if k != "cache"}
        if b["cache"]:
            out["cache_control"] = {"type": "ephemeral"}
        return out

    wire_messages = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and "cache" in b for b in content):
            m = {**m, "content": [block(b) for b in content]}
        wire_messages.append(m)
    return [block(b) for b in system], wire_messages


def make_client(*, api_key: str, base_url: str | None, stall_timeout: float = 30.0) -> anthropic.AsyncAnthropic:
    """One client for the process: pooled connections, explicit timeout, our own retries.

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


class AnthropicChatModel:
    def __init__(self, client: anthropic.AsyncAnthropic, model: str, *, max_tokens: int = 2048) -> None:
        today = dt.date.today().isoformat()
        self.configured = model
        self.name = effective_model(model, today)
        if self.name != model:
            log.warning("model.retired", configured=model, using=self.name)
        self.client = client
        self.max_tokens = max_tokens

    async def turn(self, *, system: list[dict], messages: list[dict], tools: list[dict],
                   on_text: OnText | None, deadline: float) -> ModelTurn:
        """One model turn, streamed; 429s are retried (honouring retry-after) until ``deadline``."""
        while True:
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ModelFailure("timeout", "reply deadline reached")
                async with asyncio.timeout(remaining):
                    return await self._stream(system, messages, tools, on_text)
            except Exception as e:  # noqa: BLE001 — every failure is classified
                failure = classify(e)
                if failure.kind == "rate_limited":
                    wait = retry_after_seconds(e)
                    wait = 1.0 if wait is None else wait
                    if time.monotonic() + wait < deadline - 1.0:
                        log.info("model.retry", kind=failure.kind, wait_s=wait)
                        await asyncio.sleep(wait)
                        continue
                raise failure from e

    async def _stream(self, system, messages, tools, on_text) -> ModelTurn:
        system, messages = to_wire(system, messages)
        kwargs: dict[str, Any] = dict(model=self.name, max_tokens=self.max_tokens,
                                      system=system, messages=messages)
        if tools:
            kwargs["tools"] = tools
        # The raw event stream, accumulated here: the SDK's MessageStream also rebuilds a
        # snapshot model on every event, ~25 % of a streamed call's client CPU (bench/README.md).
        blocks: list[dict[str, Any]] = []
        json_parts: dict[int, list[str]] = {}
        text = ""
        stop_reason: str | None = None
        model = self.name
        usage = {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}
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
                    blocks[ev.index] = ev.content_block.model_dump(exclude_none=True, exclude={"citations"})
                elif kind == "content_block_stop":
                    raw = "".join(json_parts.pop(ev.index, []))
                    if raw:
                        blocks[ev.index]["input"] = json.loads(raw)
                elif kind == "message_start":
                    model = ev.message.model or model
                    _take_usage(usage, ev.message.usage)
                elif kind == "message_delta":
                    stop_reason = ev.delta.stop_reason or stop_reason
                    _take_usage(usage, ev.usage)   # cumulative counts, where the API sends them
        return ModelTurn(content=[b for b in blocks if b], stop_reason=stop_reason or "end_turn",
                         model=model, usage=usage)


_USAGE_FIELDS = (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                 ("cache_read_input_tokens", "cache_read_tokens"),
                 ("cache_creation_input_tokens", "cache_write_tokens"))


def _take_usage(usage: dict[str, int], wire: Any) -> None:
    """Copy the stream's usage counts (message_start has the input side, message_delta the
    output and, on newer API versions, the input side again); absent fields change nothing."""
    for src, dst in _USAGE_FIELDS:
        value = getattr(wire, src, None)
        if value is not None:
            usage[dst] = int(value)
