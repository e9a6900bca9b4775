"""What a memory tool is, and how a tool call becomes a tool_result.

Each tool has a pydantic input model (its JSON schema is what the model sees) and runs
with a ``ToolContext`` whose ``Scope`` comes from the event — the speaking user, and the
chat only for admins — never from the model's arguments. Invalid arguments and refused
writes come back as ``is_error`` results the model can correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from memory.scope import Scope


class ToolInput(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class ToolError(Exception):
    """A refusal worth telling the model (returned as is_error)."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    scope: Scope
    facts: Any
    procedures: Any
    profile: Any
    user_text: str = ""
    session_id: str = ""     # the session of the request: what the tools write is learned from it
    # Asks the caller to confirm a side-effecting call (tool name, arguments) -> clicked yes;
    # None: nobody can be asked, so such calls are not run (bot/tools/registry.py).
    confirm: Callable[[str, dict], Awaitable[bool]] | None = None


class Tool(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    Input: ClassVar[type[ToolInput]]

    async def run(self, ctx: ToolContext, args: Any) -> str: ...


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    tool_use_id: str
    name: str
    content: str
    is_error: bool

    def as_block(self) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": self.tool_use_id,
                                 "content": self.content}
        if self.is_error:
            block["is_error"] = True
        return block


def spec(tool: Tool) -> dict[str, Any]:
    schema = tool.Input.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return {"name": tool.name, "description": tool.description, "input_schema": schema}


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ())) or "input"
        parts.append(f"{where}: {err.get('msg')}")
    return "invalid arguments — " + "; ".join(parts)


async def run_tool(tools: dict[str, Tool], block: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    name = block.get("name", "")
    tid = block.get("id", "")
    tool = tools.get(name)
    if tool is None:
        return ToolOutcome(tid, name, f"unknown tool {name!r}; available: {', '.join(sorted(tools))}", True)
    try:
        args = tool.Input.model_validate(block.get("input") or {})
    except ValidationError as e:
        return ToolOutcome(tid, name, _validation_message(e), True)
    try:
        return ToolOutcome(tid, name, await tool.run(ctx, args), False)
    except (ToolError, ValueError, PermissionError) as e:
        return ToolOutcome(tid, name, str(e) or e.__class__.__name__, True)
