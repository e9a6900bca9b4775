"""The three memory tools the model may call (DESIGN.md §3)."""

from bot.tools.base import Tool, ToolContext, ToolOutcome, run_tool, spec
from bot.tools.memory_write import MemoryWrite
from bot.tools.procedure_write import ProcedureWrite
from bot.tools.profile_update import ProfileUpdate

TOOLS: dict[str, Tool] = {t.name: t for t in (MemoryWrite(), ProcedureWrite(), ProfileUpdate())}
TOOL_SPECS: list[dict] = [spec(t) for t in TOOLS.values()]

__all__ = ["TOOLS", "TOOL_SPECS", "Tool", "ToolContext", "ToolOutcome", "run_tool", "spec"]
