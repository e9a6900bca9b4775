"""The tool loop as a table: each stop reason maps to the next step.

A test checks every value of ``anthropic.types.StopReason`` is covered, so a new stop
reason from a newer SDK is a failing test, not a silent misbehaviour.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from bot.agent.model import ChatModel, ModelTurn, OnText
from bot.tools import TOOLS, ToolContext, ToolOutcome, run_tool


class Step(enum.Enum):
    FINISH = "finish"              # the answer is complete
    TRUNCATED = "truncated"        # the answer is cut; deliver what there is with a note
    RUN_TOOLS = "run_tools"        # run the tools, send results, ask again
    CONTINUE = "continue"          # the server paused a long turn; ask it to go on
    REFUSED = "refused"            # the model declined; deliver its text or a short note


STOP_STEPS: dict[str, Step] = {
    "end_turn": Step.FINISH,
    "stop_sequence": Step.FINISH,
    "max_tokens": Step.TRUNCATED,
    "model_context_window_exceeded": Step.TRUNCATED,
    "tool_use": Step.RUN_TOOLS,
    "pause_turn": Step.CONTINUE,
    "refusal": Step.REFUSED,
}

MAX_ITERATIONS = 6


@dataclass
class LoopResult:
    text: str
    iterations: int
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    stop_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)


async def run_loop(model: ChatModel, *, system: list[dict], messages: list[dict], tools: list[dict],
                   ctx: ToolContext, on_text: OnText | None, deadline: float,
                   max_iterations: int = MAX_ITERATIONS) -> LoopResult:
    convo = list(messages)
    outcomes: list[ToolOutcome] = []
    texts: list[str] = []
    usage: dict[str, int] = {}
    turn: ModelTurn | None = None

    async def _on_text(so_far: str) -> None:
        # Earlier iterations' text stays on screen while a later one streams.
        if on_text is not None:
            await on_text("\n\n".join([*(t.strip() for t in texts if t.strip()), so_far]))

    for i in range(1, max_iterations + 1):
        last = i == max_iterations
        turn = await model.turn(system=system, messages=convo, tools=tools,
                                on_text=_on_text, deadline=deadline)
        for k, v in turn.usage.items():
            usage[k] = usage.get(k, 0) + v
        if turn.text:
            texts.append(turn.text)
        step = STOP_STEPS.get(turn.stop_reason, Step.FINISH)
        if step is Step.RUN_TOOLS and turn.tool_uses and not last:
            convo.append({"role": "assistant", "content": turn.content})
            results = [await run_tool(TOOLS, b, ctx) for b in turn.tool_uses]
            outcomes.extend(results)
            convo.append({"role": "user", "content": [r.as_block() for r in results]})
            continue
        if step is Step.CONTINUE and not last:
            convo.append({"role": "assistant", "content": turn.content})
            continue
        text = "\n\n".join(t.strip() for t in texts if t.strip())
        if step is Step.TRUNCATED:
            text = (text + "\n\n…") if text else "…"
        return LoopResult(text, i, outcomes, turn.stop_reason, usage)
    text = "\n\n".join(t.strip() for t in texts if t.strip())
    return LoopResult(text, max_iterations, outcomes, turn.stop_reason if turn else "", usage)

