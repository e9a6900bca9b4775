"""The tool port: one registry of providers; the tool loop runs whatever it offers.

A **provider** (the memory tools, the Feishu documents reader, each MCP server, reminders…)
is anything with a ``name`` and a ``tools()`` method returning its current ``ToolDef``s. A
``ToolDef`` is the whole contract of one tool: its name (unique across providers: MCP tools
are ``mcp_<server>__<tool>``), description, JSON schema, whether it only reads, a timeout,
and ``async call(ctx, args) -> str``. The registry, not the tool, does what every call needs:

- the **offer** for a request: the providers' tools the policy allows in this chat type for
  this caller (``ToolPolicy``);
- arguments **validated** against the schema (jsonschema) before the call;
- a **timeout** (the model is told the tool timed out), a **size cap** (with a note), errors
  turned into ``is_error`` results — a tool never ends the turn;
- a side-effecting tool in a group runs only after the caller **confirms** (``ctx.confirm``);
- every result **fenced** as data (``<untrusted_content kind="tool" …>``): a server or a
  document may carry "ignore previous instructions" text;
- **metrics** per tool (calls, errors, latency) through ``on_call``.

Nothing in the loop knows which provider a tool came from (bot/agent/loop.py).
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

import jsonschema

from bot.agent.prompt import fence_material
from bot.core.inbound import Material
from bot.infra.log import get_logger
from bot.tools.base import ToolContext, ToolError, ToolOutcome
from memory.llm import ToolSpec

log = get_logger("ethan.tools")

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")   # what both providers accept as a tool name
MAX_RESULT_CHARS = 16_000                         # one result; longer ones are cut with a note
DEFAULT_TIMEOUT = 30.0

ToolCall = Callable[[ToolContext, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str
    input_schema: dict[str, Any]
    call: ToolCall
    read_only: bool = True
    timeout: float = DEFAULT_TIMEOUT
    # Side effects confined to the caller's own memory (the memory tools): offered everywhere
    # and never confirmed — scope is fixed by the event, not by the arguments.
    own_scope: bool = False


class ToolProvider(Protocol):
    name: str

    def tools(self) -> Sequence[ToolDef]:
        """The provider's tools as of now (an MCP server's list changes on list_changed)."""
        ...


@dataclass(frozen=True)
class ToolPolicy:
    """Which tools are offered where (config.yaml ``tools:``; docs/operations.md "Tools").

    Defaults: read-only tools everywhere, side-effecting tools in p2p only (in a group they
    would need the asker's click); ``providers`` limits a provider to chat types; ``admins_only``
    names tools or providers only admins get; ``disabled`` names tools or providers never
    offered. ``chat_types`` limits a tool or a whole provider to ``p2p`` / ``group``."""

    side_effects_in_groups: bool = False
    chat_types: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tool or provider -> chat types
    admins_only: frozenset[str] = frozenset()
    disabled: frozenset[str] = frozenset()

    def allows(self, provider: str, tool: ToolDef, *, chat_type: str, is_admin: bool) -> bool:
        if tool.name in self.disabled or provider in self.disabled:
            return False
        if (tool.name in self.admins_only or provider in self.admins_only) and not is_admin:
            return False
        kinds = self.chat_types.get(tool.name, self.chat_types.get(provider))
        if kinds is not None and _kind(chat_type) not in kinds:
            return False
        if not tool.read_only and not tool.own_scope and _kind(chat_type) != "p2p":
            return self.side_effects_in_groups
        return True

    def needs_confirmation(self, tool: ToolDef, chat_type: str) -> bool:
        return not tool.read_only and not tool.own_scope and _kind(chat_type) != "p2p"


def _kind(chat_type: str) -> str:
    return "p2p" if chat_type == "p2p" else "group"


def cap(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… cut: the first {limit} of {len(text)} characters are shown]"


@dataclass(frozen=True)
class Offer:
    """The tools of one request: what the model is shown, by name."""

    tools: dict[str, tuple[str, ToolDef]]          # name -> (provider, tool)

    @property
    def specs(self) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.input_schema) for _, t in self.tools.values()]

    @property
    def spec_dicts(self) -> list[dict[str, Any]]:
        return [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for _, t in self.tools.values()]


OnCall = Callable[[str, str, float], None]     # (tool name, outcome ok|error|timeout, seconds)


class ToolRegistry:
    def __init__(self, providers: Iterable[ToolProvider] = (), *, policy: ToolPolicy | None = None,
                 on_call: OnCall | None = None, max_result_chars: int = MAX_RESULT_CHARS) -> None:
        self.providers: list[ToolProvider] = []
        self.policy = policy or ToolPolicy()
        self.on_call = on_call
        self.max_result_chars = max_result_chars
        self._validators: dict[str, tuple[dict, Any]] = {}
        for p in providers:
            self.add(p)

    def add(self, provider: ToolProvider) -> None:
        if any(p.name == provider.name for p in self.providers):
            raise ValueError(f"tool provider {provider.name!r} is registered twice")
        self.providers.append(provider)

    def offer(self, ctx: ToolContext) -> Offer:
        out: dict[str, tuple[str, ToolDef]] = {}
        for p in self.providers:
            try:
                tools = p.tools()
            except Exception as e:  # noqa: BLE001 — one provider's failure hides only its tools
                log.warning("tools.provider_failed", provider=p.name, error=f"{e.__class__.__name__}: {e}"[:200])
                continue
            for t in tools:
                if not NAME_RE.match(t.name):
                    continue
                if t.name in out:   # names are prefixed per provider; a clash is a bug: first wins
                    log.warning("tools.name_clash", tool=t.name, provider=p.name, kept=out[t.name][0])
                    continue
                if self.policy.allows(p.name, t, chat_type=ctx.scope.chat_type, is_admin=ctx.scope.is_admin):
                    out[t.name] = (p.name, t)
        return Offer(out)

    async def run(self, offer: Offer, block: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        name = str(block.get("name", ""))
        tid = str(block.get("id", ""))
        started = time.monotonic()
        entry = offer.tools.get(name)
        if entry is None:
            return self._done(tid, name, f"unknown tool {name!r}; available: {', '.join(sorted(offer.tools))}",
                              "error", started)
        provider, tool = entry
        args = block.get("input") or {}
        validator = self._validator(tool)
        if validator is not None:
            error = jsonschema.exceptions.best_match(validator.iter_errors(args))
            if error is not None:
                where = ".".join(str(x) for x in error.absolute_path) or "input"
                return self._done(tid, name, f"invalid arguments — {where}: {error.message[:300]}",
                                  "error", started)
        if self.policy.needs_confirmation(tool, ctx.scope.chat_type):
            if ctx.confirm is None or not await ctx.confirm(name, args):
                return self._done(tid, name, "the user did not confirm this action; it was not run. "
                                  "Tell them it was not done.", "declined", started)
        try:
            text = await asyncio.wait_for(tool.call(ctx, args), timeout=tool.timeout)
        except asyncio.TimeoutError:
            log.warning("tools.timeout", tool=name, provider=provider, timeout=tool.timeout,
                        chat_id=ctx.scope.chat_id)
            return self._done(tid, name, f"the tool did not answer within {tool.timeout:g} s and was "
                              "stopped; tell the user it is unavailable right now", "timeout", started)
        except (ToolError, ValueError, PermissionError) as e:
            # an error's text is the tool's words too (an MCP server's isError result): material
            if not tool.own_scope:
                ctx.seen.append(str(e)[:self.max_result_chars])
            return self._done(tid, name, str(e) or e.__class__.__name__, "error", started)
        except Exception as e:  # noqa: BLE001 — any tool failure is a result, never a failed turn
            log.warning("tools.failed", tool=name, provider=provider, chat_id=ctx.scope.chat_id,
                        error=f"{e.__class__.__name__}: {e}"[:300])
            if not tool.own_scope:
                ctx.seen.append(str(e)[:200])
            return self._done(tid, name, f"the tool failed ({e.__class__.__name__}: {str(e)[:200]}); "
                              "tell the user it did not work", "error", started)
        if not tool.own_scope:
            ctx.seen.append(str(text)[:self.max_result_chars])   # material for this turn's memory writes
        return self._done(tid, name, str(text), "ok", started)

    def _validator(self, tool: ToolDef):
        """The schema's validator, checked and built once per schema (not per call)."""
        cached = self._validators.get(tool.name)
        if cached is not None and cached[0] is tool.input_schema:
            return cached[1]
        try:
            cls = jsonschema.validators.validator_for(tool.input_schema)
            cls.check_schema(tool.input_schema)
            validator = _without_regexes(cls)(tool.input_schema)
        except (jsonschema.SchemaError, RecursionError):
            validator = None   # a server's own bad (or absurdly deep) schema: the server judges the arguments
        self._validators[tool.name] = (tool.input_schema, validator)
        return validator

    def _done(self, tid: str, name: str, text: str, outcome: str, started: float) -> ToolOutcome:
        if self.on_call is not None:
            self.on_call(name or "?", outcome, time.monotonic() - started)
        return ToolOutcome(tid, name, fence_material(Material(kind="tool", source=name,
                                                                     text=cap(text, self.max_result_chars))),
                           outcome != "ok")


def _skip(validator, value, instance, schema):
    return iter(())


def _additional_without_patterns(original):
    def check(validator, aP, instance, schema):
        if "patternProperties" in schema:      # which names are "additional" is a regex question
            return iter(())
        return original(validator, aP, instance, schema)
    return check


@functools.lru_cache(maxsize=None)
def _without_regexes(cls):
    """``cls`` with the schema's regular expressions (``pattern``, ``patternProperties``) not
    run here: an MCP server writes them, the model's (a user's) arguments meet them, and
    Python's ``re`` backtracks without bound on the event loop — ``^(a+)+$`` against 27 a's
    and a "!" held it ~10 s (issue 45 sweep). The server checks its own patterns."""
    return jsonschema.validators.extend(cls, validators={
        "pattern": _skip, "patternProperties": _skip,
        "additionalProperties": _additional_without_patterns(cls.VALIDATORS["additionalProperties"])})


__all__ = ["ToolDef", "ToolProvider", "ToolPolicy", "ToolRegistry", "Offer", "cap",
           "MAX_RESULT_CHARS", "NAME_RE"]
