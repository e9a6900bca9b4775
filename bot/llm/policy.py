"""What every adapter shares: the retry/deadline policy and structured-output modes.

The SDKs' own retries are off (``max_retries=0``) on every provider: the policy is ours,
because it must respect the per-reply deadline and must never retry a spend limit. A 429
is retried (honouring ``retry-after``, 1 s when absent) only while the wait still fits the
deadline; every other failure is raised at once, classified, for the caller (the agent's
apology, the fallback chain, the consolidation queue's retry) to decide.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any, Awaitable, Callable

from bot.infra.log import get_logger
from memory.llm import ModelFailure
from memory.models import caps

log = get_logger("ethan.model")


# How a failed connect is told apart (issue 52): the detail of a "connection" failure starts
# with one of these, so the start-up line and /chat say which (a misspelt host is not a timeout).
DNS_FAILED = "DNS lookup failed"
REFUSED = "connection refused"
# A base URL whose model routes all answer 404 (OPENAI_BASE_URL without /v1): the start-up
# check's detail starts with this, and the line blames the base URL, not the model name.
NO_ROUTES = "no model routes"


def refused_cause(exc: BaseException) -> str:
    """The failed name lookup, or refused or failed connect, behind a transport error, however
    the SDK filed it (its aiohttp transport files both under a connect *timeout*): its text,
    prefixed ``DNS lookup failed: `` / ``connection refused: ``, or "" when the cause chain has
    neither."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    # the innermost cause says most: aiohttp's connector error wraps the refused connect
    for cur in chain:
        if isinstance(cur, socket.gaierror):
            return f"{DNS_FAILED}: {cur.strerror or cur}"
        if isinstance(cur, ConnectionRefusedError):
            return f"{REFUSED}: {cur}"
    for cur in chain:
        if isinstance(cur, ConnectionResetError) or (isinstance(cur, OSError) and "Connect call failed" in str(cur)):
            return str(cur)
    return ""


async def with_policy(call: Callable[[], Awaitable[Any]], *, deadline: float,
                      classify: Callable[[BaseException], ModelFailure], model: str) -> Any:
    """Run ``call`` under ``deadline`` (a ``time.monotonic()`` instant) with our 429 retries."""
    while True:
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ModelFailure("timeout", "reply deadline reached")
            async with asyncio.timeout(remaining):
                return await call()
        except Exception as e:  # noqa: BLE001 — every failure is classified
            failure = classify(e)
            if failure.kind == "rate_limited":
                wait = 1.0 if failure.retry_after is None else failure.retry_after
                if time.monotonic() + wait < deadline - 1.0:
                    log.info("model.retry", model=model, kind=failure.kind, wait_s=wait)
                    await asyncio.sleep(wait)
                    continue
            if failure is e:
                raise
            raise failure from e


async def policy_turn(stream: Callable[[str | None], Awaitable[Any]], *, structured: bool,
                      modes: "StructuredModes", rejects: Any, deadline: float,
                      classify: Callable[[BaseException], ModelFailure], model: str) -> Any:
    """One adapter turn: ``stream(mode)`` under ``with_policy``; for a structured request, a 400
    rejecting the current mode steps that model down (``StructuredModes``) and tries again."""
    if not structured:
        return await with_policy(lambda: stream(None), deadline=deadline, classify=classify, model=model)
    mode = modes.mode_for(model)
    while True:
        try:
            return await with_policy(lambda: stream(mode), deadline=deadline, classify=classify, model=model)
        except ModelFailure as failure:
            nxt = modes.step_down(model, mode, failure, rejects)
            if nxt is None:
                raise
            mode = nxt


def parse_retry_after(headers: Any, names: tuple[str, ...] = ("retry-after",)) -> float | None:
    if headers is None:
        return None
    for name in names:
        v = headers.get(name)
        if v:
            try:
                return max(0.0, float(v))
            except ValueError:
                continue
    return None


class StructuredModes:
    """How a model is asked for one JSON object: ``tool`` (a forced tool call), ``structured``
    (a JSON-schema response format) or ``json`` (a plain instruction, parsed from the text).

    The start comes from the capability table (``memory.models.caps``); a 400 that rejects the
    stronger mode moves that model one step down for the life of the process (learned at run
    time, so a gateway that lies about its model still consolidates)."""

    def __init__(self) -> None:
        self._learned: dict[str, str] = {}

    def mode_for(self, model: str) -> str:
        learned = self._learned.get(model)
        c = caps(model)
        if learned == "json":
            return "json"
        if learned == "structured":
            return "structured" if c.structured_outputs else "json"
        if c.forced_tool_use:
            return "tool"
        if c.structured_outputs:
            return "structured"
        return "json"

    def step_down(self, model: str, mode: str, failure: ModelFailure,
                  rejects: dict[str, tuple[str, ...]]) -> str | None:
        """The next mode after ``failure`` (a 400) rejected ``mode``, or None (not about the mode)."""
        if failure.kind != "bad_request":
            return None
        text = failure.detail.lower()
        if not any(h in text for h in rejects.get(mode, ())):
            return None
        self._learned[model] = "structured" if mode == "tool" else "json"
        nxt = self.mode_for(model)
        log.info("model.structured_mode_learned", model=model, rejected=mode, now=nxt)
        return nxt if nxt != mode else None


def json_instruction(name: str, schema: dict) -> str:
    return (f"\n\nAnswer with one JSON object only, no prose, matching this JSON schema "
            f"({name}): {json.dumps(schema, ensure_ascii=False)}")


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The one JSON object in a model's text (a code fence or surrounding prose tolerated)."""
    text = (text or "").strip()
    if text.startswith("```"):
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        start, end = text.find("{"), text.rfind("}")
        try:
            data = json.loads(text[start: end + 1]) if 0 <= start < end else None
        except json.JSONDecodeError:
            data = None
    return data if isinstance(data, dict) else None
