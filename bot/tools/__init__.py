"""The tools the model may call: the port (registry.py) and the built-in providers."""

from bot.tools.base import Tool, ToolContext, ToolOutcome, run_tool, spec
from bot.tools.memory_provider import MemoryTools
from bot.tools.memory_write import MemoryWrite
from bot.tools.procedure_write import ProcedureWrite
from bot.tools.profile_update import ProfileUpdate
from bot.tools.registry import Offer, ToolDef, ToolPolicy, ToolProvider, ToolRegistry

TOOLS: dict[str, Tool] = {t.name: t for t in (MemoryWrite(), ProcedureWrite(), ProfileUpdate())}
TOOL_SPECS: list[dict] = [spec(t) for t in TOOLS.values()]


def memory_tools() -> MemoryTools:
    return MemoryTools(list(TOOLS.values()))


def default_registry(**kw) -> ToolRegistry:
    """The memory tools alone (what a bare Agent offers)."""
    return ToolRegistry([memory_tools()], **kw)


__all__ = ["TOOLS", "TOOL_SPECS", "Tool", "ToolContext", "ToolOutcome", "run_tool", "spec",
           "MemoryTools", "memory_tools", "default_registry",
           "Offer", "ToolDef", "ToolPolicy", "ToolProvider", "ToolRegistry"]
