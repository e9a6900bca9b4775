"""The tool loop as a table: each stop reason maps to the next step.

The table covers every ``memory.llm.StopReason`` (a test checks it), and each adapter maps
its provider's stop/finish reasons onto those values (tested per adapter), so a new stop
reason is a failing test, not a silent misbehaviour. The loop speaks only the model port and
the tool port (bot/tools/registry.py): it offers the registry's tools for this request and runs
the calls through the registry, never knowing which provider a tool came from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from bot.tools import ToolContext, ToolOutcome, default_registry
from bot.tools.registry import Offer, ToolRegistry
from memory.llm import ChatModel, Message, ModelRequest, ModelResponse, OnText, StopReason, Usage


class Step(enum.Enum):
    FINISH = "finish"              # the answer is complete
    TRUNCATED = "truncated"        # the answer is cut; deliver what there is with a note
    RUN_TOOLS = "run_tools"        # run the tools, send results, ask again
    CONTINUE = "continue"          # the server paused a long turn; ask it to go on
    REFUSED = "refused"            # the model declined; deliver its text or a short note


STOP_STEPS: dict[StopReason, Step] = {
    StopReason.END_TURN: Step.FINISH,
    StopReason.STOP_SEQUENCE: Step.FINISH,
    StopReason.MAX_TOKENS: Step.TRUNCATED,
    StopReason.CONTEXT_EXCEEDED: Step.TRUNCATED,
    StopReason.TOOL_USE: Step.RUN_TOOLS,
    StopReason.PAUSE_TURN: Step.CONTINUE,
    StopReason.REFUSAL: Step.REFUSED,
}

MAX_ITERATIONS = 6
_MEMORY_ONLY = default_registry()


@dataclass
class LoopResult:
    text: str
    iterations: int
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    stop_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    model: str = ""                 # the model that gave the last answer (a fallback, maybe)
    provider: str = ""
    # The tool round trips, in the port's neutral shape: (assistant content with tool_use
    # blocks, the tool_result blocks sent back), in order. Stored with the answer.
    rounds: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=list)


async def run_loop(model: ChatModel, *, system: list[dict], messages: list[Message],
                   registry: ToolRegistry | None = None, offer: Offer | None = None,
                   ctx: ToolContext, on_text: OnText | None,
                   deadline: float, max_iterations: int = MAX_ITERATIONS) -> LoopResult:
    registry = registry or _MEMORY_ONLY
    offer = offer if offer is not None else registry.offer(ctx)
    tools = offer.specs
    convo: list[Message] = list(messages)
    outcomes: list[ToolOutcome] = []
    texts: list[str] = []
    usage = Usage()
    rounds: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    resp: ModelResponse | None = None

    async def _on_text(so_far: str) -> None:
        # Earlier iterations' text stays on screen while a later one streams.
        if on_text is not None:
            await on_text("\n\n".join([*(t.strip() for t in texts if t.strip()), so_far]))

    for i in range(1, max_iterations + 1):
        last = i == max_iterations
        resp = await model.turn(ModelRequest(system=system, messages=convo, tools=tools),
                                on_text=_on_text, deadline=deadline)
        usage = usage + resp.usage
        if resp.text:
            texts.append(resp.text)
        step = STOP_STEPS.get(resp.stop_reason, Step.FINISH)
        if step is Step.RUN_TOOLS and resp.tool_uses and not last:
            convo.append({"role": "assistant", "content": resp.content})
            results = [await registry.run(offer, b, ctx) for b in resp.tool_uses]
            outcomes.extend(results)
            blocks = [r.as_block() for r in results]
            rounds.append((resp.content, blocks))
            convo.append({"role": "user", "content": blocks})
            continue
        if step is Step.CONTINUE and not last:
            convo.append({"role": "assistant", "content": resp.content})
            continue
        text = "\n\n".join(t.strip() for t in texts if t.strip())
        if step is Step.TRUNCATED:
            text = (text + "\n\n…") if text else "…"
        return LoopResult(text, i, outcomes, resp.stop_reason.value, usage, resp.model, resp.provider, rounds)
    text = "\n\n".join(t.strip() for t in texts if t.strip())
    return LoopResult(text, max_iterations, outcomes, resp.stop_reason.value if resp else "", usage,
                      resp.model if resp else "", resp.provider if resp else "", rounds)

