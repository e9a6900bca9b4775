"""The tool port's cost (issue 26): what one tool call adds to a turn, and what the tool
schemas add to every prompt.

1. **Loop overhead per call** — ``run_loop`` with a scripted in-process model (no network:
   each turn answers a tool_use, then text) in the same run, for: no tool round at all; a tool
   round through the registry to a trivial in-process tool (validation, timeout, cap, fence);
   and a round to a real MCP server over stdio (tests/tools/mcp_server.py, the ``mcp`` SDK).
   Overhead = (median turn with the round − median turn without) per call.
2. **Prompt tokens of the tool schemas** — the offered tools' JSON (name, description, schema)
   as the fake Messages API counts it (ceil(chars / 4), ``estimate_tokens``): the memory tools,
   and with the test MCP server's five tools.

    python -m bench.bench_tools [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import median, table  # noqa: E402

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


class ScriptedModel:
    """A ChatModel that asks for ``tool`` once per turn pair, then answers text."""

    name, provider = "bench-model", "bench"

    def __init__(self, tool: str | None, args: dict) -> None:
        self.tool, self.args, self.n = tool, args, 0

    async def turn(self, request, *, on_text=None, deadline):
        from memory.llm import ModelResponse, StopReason
        self.n += 1
        last = request.messages[-1]["content"]
        after_tool = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if self.tool and not after_tool:
            return ModelResponse([{"type": "tool_use", "id": f"tu_{self.n}", "name": self.tool,
                                   "input": self.args}], StopReason.TOOL_USE, self.name)
        return ModelResponse([{"type": "text", "text": "done"}], StopReason.END_TURN, self.name)


async def _turns(registry, tool: str | None, args: dict, n: int) -> list[float]:
    from bot.agent.loop import run_loop
    from bot.tools import ToolContext
    from memory.scope import Scope

    ctx = ToolContext(scope=Scope("ou_bench", "oc_bench", "p2p"), facts=None, procedures=None, profile=None)
    model = ScriptedModel(tool, args)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await run_loop(model, system=[{"type": "text", "text": "s"}],
                           messages=[{"role": "user", "content": "hi"}], registry=registry, ctx=ctx,
                           on_text=None, deadline=time.monotonic() + 30)
        out.append((time.perf_counter() - t0) * 1000)
        assert r.text == "done", r.text
    return out


async def _measure(quick: bool) -> list[str]:
    from bot.infra.config.sections import McpServerConfig
    from bot.tools import memory_tools
    from bot.tools.mcp import McpServer
    from bot.tools.registry import ToolDef, ToolRegistry
    from tests.fakes.fake_anthropic import estimate_tokens

    async def echo(ctx, args):
        return "result " + args["q"]

    class Local:
        name = "local"

        def tools(self):
            return (ToolDef("local_echo", "Echo", SCHEMA, echo),)

    tmp = Path(tempfile.mkdtemp(prefix="ethan-bench-tools-"))
    server = McpServer("bench", McpServerConfig(
        command=sys.executable, args=[str(ROOT / "tests/tools/mcp_server.py"), "stdio"],
        env={"EVENTS_FILE": str(tmp / "events")}, timeout=30), ping_seconds=60)
    server.start()
    if not await server.wait_connected(30):
        raise RuntimeError(f"MCP server did not start: {server.problem}")
    try:
        registry = ToolRegistry([memory_tools(), Local(), server])
        n = 60 if quick else 400
        await _turns(registry, "local_echo", {"q": "x"}, 10)          # warm-up
        await _turns(registry, "mcp_bench__lookup", {"q": "x"}, 10)
        rows_raw = {"none": [], "local": [], "mcp": []}
        for _ in range(4):            # alternate, so machine noise hits all three
            rows_raw["none"] += await _turns(registry, None, {}, n // 4)
            rows_raw["local"] += await _turns(registry, "local_echo", {"q": "x"}, n // 4)
            rows_raw["mcp"] += await _turns(registry, "mcp_bench__lookup", {"q": "x"}, n // 4)
        base = median(rows_raw["none"])
        rows = [("no tool call (1 model turn)", f"{base:.3f}", "—"),
                ("+ call to an in-process tool (2 model turns)", f"{median(rows_raw['local']):.3f}",
                 f"{median(rows_raw['local']) - base:.3f}"),
                ("+ call to an MCP server tool over stdio", f"{median(rows_raw['mcp']):.3f}",
                 f"{median(rows_raw['mcp']) - base:.3f}")]
        memory_only = ToolRegistry([memory_tools()])
        from bot.tools import ToolContext
        from memory.scope import Scope
        ctx = ToolContext(scope=Scope("ou", "oc", "p2p"), facts=None, procedures=None, profile=None)

        def tokens(reg) -> tuple[int, int]:
            specs = reg.offer(ctx).spec_dicts
            return len(specs), estimate_tokens({"tools": specs, "messages": []})

        m_n, m_t = tokens(memory_only)
        a_n, a_t = tokens(ToolRegistry([memory_tools(), server]))
    finally:
        await server.stop()
    lines = [f"Same run, {n} turns each, alternating; a scripted in-process model (no network).", ""]
    lines += table(["turn", "median ms", "overhead per call, ms"], rows)
    lines += ["", "Prompt tokens the tool schemas add (every request carries them; cached with the prefix):", ""]
    lines += table(["tools offered", "tools", "tokens"],
                   [("memory tools", m_n, m_t), ("memory + test MCP server", a_n, a_t),
                    ("per MCP tool (average)", a_n - m_n, f"{(a_t - m_t) / max(1, a_n - m_n):.0f}")])
    return lines


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_measure(quick))


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
