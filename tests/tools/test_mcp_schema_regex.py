"""An MCP server's schema regex never runs on the event loop (issue 45 sweep).

The server (tests/tools/mcp_server.py, a real ``mcp`` SDK server over stdio) declares
``code_lookup(code)`` with ``pattern: ^(a+)+$``; the model calls it with 27 a's and a "!". The
tool port validated the arguments with that regex in Python's ``re`` on the loop: ~10 s of
backtracking, every chat stalled. Now the port checks the shape only and the server judges its
own pattern: the user gets an answer and the loop stays free meanwhile."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fakes.fake_anthropic import ToolUse
from tests.harness import Harness
from tests.loop_gaps import loop_gaps

SERVER = Path(__file__).with_name("mcp_server.py")


async def test_a_servers_pattern_does_not_stall_the_loop(tmp_path):
    cfg = {"command": sys.executable, "args": [str(SERVER), "stdio"],
           "env": {"PID_FILE": str(tmp_path / "pids"), "EVENTS_FILE": str(tmp_path / "events")}}
    async with Harness(tmp_path, mcp_servers={"team": cfg}) as h:
        async with loop_gaps() as gaps:
            h.model.script(ToolUse("mcp_team__code_lookup", {"code": "a" * 27 + "!"}))
            await h.send_text("look up code aaaa…!", chat_id="oc_p2p_alice", sender="ou_alice")
            [reply] = await h.replies(1, timeout=30)
        assert "code_lookup" in reply.text or "pattern" in reply.text.lower() or "error" in reply.text.lower(), reply.text
        assert max(gaps, default=0) < 3.0, max(gaps)      # before: ~10 s in re on the loop
