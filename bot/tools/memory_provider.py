"""The three memory tools (DESIGN.md §3) as one provider of the tool port.

Their names, schemas and behaviour are unchanged: each keeps its pydantic input model (the
JSON schema the model sees, and the validation with its messages); their side effects touch
only the caller's own memory (scope from the event), so they are offered everywhere unconfirmed.
"""

from __future__ import annotations

from typing import Any, Sequence

from bot.tools.base import Tool, ToolContext, spec
from bot.tools.registry import ToolDef

from bot.tools.confirm import CONFIRM_WAIT_S

MEMORY_TOOL_TIMEOUT = 15.0
# A write that is not the user's own words waits for the asker's click (bot/tools/base.py
# own_words, at most CONFIRM_WAIT_S) before it is written: the timeout leaves room for both.
MEMORY_TOOL_BUDGET = MEMORY_TOOL_TIMEOUT + CONFIRM_WAIT_S


def _def(tool: Tool) -> ToolDef:
    s = spec(tool)

    async def call(ctx: ToolContext, args: dict[str, Any]) -> str:
        return await tool.run(ctx, tool.Input.model_validate(args))   # ValidationError is a ValueError

    return ToolDef(s["name"], s["description"], s["input_schema"], call, read_only=False,
                   timeout=MEMORY_TOOL_BUDGET, own_scope=True)


class MemoryTools:
    name = "memory"

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._defs = tuple(_def(t) for t in tools)

    def tools(self) -> Sequence[ToolDef]:
        return self._defs
