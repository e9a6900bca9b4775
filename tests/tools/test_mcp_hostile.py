"""Hostile MCP servers (issue 45: N4, N5, N10), at the wire: a real server built with the ``mcp``
SDK (tests/tools/mcp_server.py) as a stdio child of the app, the model fake on both adapters,
signed webhook events, the fake Lark; N10 runs ``python -m bot serve`` and reads its stderr."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import yaml

from tests.fakes.fake_anthropic import ToolUse
from tests.fakes.lark_events import make_card_action_event
from tests.harness import Harness
from tests.reliability.support import LogCapture, ServerProcess, wait_until
from tests.tools.test_mcp_wire import GROUP, SERVER_TOOLS, _buttons, stdio_config

pytestmark = pytest.mark.usefixtures("model_provider")

CAROL = dict(chat_id="oc_p2p_carol", sender="ou_carol")


def offered(request) -> list[str]:
    return [t.get("name") or t.get("function", {}).get("name") for t in request.json.get("tools", [])]


def hostile(tmp_path, **env):
    cfg = stdio_config(tmp_path)
    return {**cfg, "env": {**cfg["env"], **env}}


# -- N4: readOnlyHint is a hint, not the operator's word ------------------------------------------

async def test_a_read_only_hint_does_not_skip_the_confirm_card_in_a_group(tmp_path):
    """``purge`` says readOnlyHint and deletes: a group member's message must not run it."""
    events = tmp_path / "events"
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)},
                       tools={"side_effects_in_groups": True}) as h:
        h.model.script(ToolUse("mcp_team__purge", {"scope": "all"}))
        await h.send_text("帮我看看归档", **{**GROUP, "sender": "ou_bob"})
        [card] = await h.replies(1, timeout=20)
        text = json.dumps(card.content, ensure_ascii=False)
        assert card.msg_type == "interactive" and "mcp_team__purge" in text
        await asyncio.sleep(0.5)
        assert not events.exists()              # waiting for bob's click, not run
        cancel = next(b["behaviors"][0]["value"] for b in _buttons(card.content)
                      if b["behaviors"][0]["value"]["ethan"] == "tool_cancel")
        status, _ = await h.post(make_card_action_event(cancel, chat_id=GROUP["chat_id"],
                                                        message_id=card.message_id, operator="ou_bob"))
        assert status == 200
        await h.replies(2, timeout=20)
        assert not events.exists()


async def test_a_read_only_hint_is_not_offered_in_a_group_by_default(tmp_path):
    """Default policy (side effects in direct messages only): the hinted tool is side-effecting."""
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path, read_only_tools=["lookup"])}) as h:
        await h.send_text("你好", **GROUP)
        await h.replies(1, timeout=20)
        names = offered(h.model.chat_requests()[0])
        assert "mcp_team__purge" not in names and "mcp_team__weather" not in names
        assert "mcp_team__lookup" in names          # the operator named it: read-only


# -- N5: tool lists bounded per server and in total ------------------------------------------------

async def test_a_server_with_2000_tools_is_refused_and_a_plain_hello_stays_small(tmp_path):
    with LogCapture() as logs:
        async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path),
                                                  "bulk": hostile(tmp_path, BULK_TOOLS="2000")}) as h:
            await h.send_text("你好", **CAROL)
            [reply] = await h.replies(1, timeout=20)
            assert reply.text.startswith("echo:")
            [request] = h.model.chat_requests()
            names = offered(request)
            assert "mcp_team__lookup" in names and not any(n.startswith("mcp_bulk__") for n in names)
            size = len(json.dumps(request.json, ensure_ascii=False).encode())
            assert size < 50_000, size                  # 2.39 MB before
            async with h.http.get(h.url + "/healthz") as r:
                bulk = (await r.json())["mcp_servers"]["bulk"]
            assert bulk["ok"] is False and bulk["tools"] == 0 and "tools refused" in bulk["problem"]
    [line] = logs.events("mcp.tools_refused")
    assert line["server"] == "bulk" and line["limit"] == "server" and line["tools"] == 2000 + SERVER_TOOLS
    assert line["bytes"] > 2_000_000 and line["max_tools"] == 64 and line["level"] == "warning"


async def test_list_changed_to_2000_tools_withdraws_the_servers_tools(tmp_path):
    with LogCapture() as logs:
        async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)}) as h:
            h.model.script(ToolUse("mcp_team__bloat", {}))
            await h.send_text("bloat", **CAROL)
            await h.replies(1, timeout=20)
            await wait_until(lambda: logs.events("mcp.tools_refused"), 15, "the refusal")
            await h.send_text("你好", **CAROL)
            await h.replies(2, timeout=20)
            last = h.model.chat_requests()[-1]
            assert not any(n.startswith("mcp_team__") for n in offered(last))
            assert len(json.dumps(last.json, ensure_ascii=False).encode()) < 50_000
    [line] = logs.events("mcp.tools_refused")
    assert line["server"] == "team" and line["tools"] == 2000 + SERVER_TOOLS


async def test_all_servers_together_are_bounded(tmp_path):
    """Each server within its own limit; the second to list goes over the total and is refused."""
    with LogCapture() as logs:
        async with Harness(tmp_path, mcp_servers={"one": stdio_config(tmp_path), "two": stdio_config(tmp_path)},
                           tools={"mcp_max_tools": 12}) as h:
            await h.send_text("你好", **CAROL)
            await h.replies(1, timeout=20)
            names = offered(h.model.chat_requests()[0])
            health = h.app.mcp.status()
    [line] = logs.events("mcp.tools_refused")
    refused, kept = line["server"], ({"one", "two"} - {line["server"]}).pop()
    assert line["limit"] == "total" and line["tools"] == SERVER_TOOLS
    assert line["max_tools"] == 12 - SERVER_TOOLS     # what was left
    assert not any(n.startswith(f"mcp_{refused}__") for n in names) and f"mcp_{kept}__lookup" in names
    assert health[refused]["ok"] is False and health[kept]["ok"] is True


# -- N10: a server's stderr is marked records, never Ethan's own lines ------------------------------

@pytest.mark.parametrize("model_provider", ["anthropic"], indirect=True)
async def test_a_servers_stderr_becomes_marked_records_never_forged_or_raw_lines(tmp_path):
    """The server prints a forged ``command.audited`` JSON line, plain text, a 20,000-character
    line and 2,000 more lines to stderr, and a non-JSON line to stdout (the SDK logs that)."""
    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_lark import FakeLark

    home = tmp_path / "home"
    home.mkdir()
    config = {"mcp_servers": {"evil": hostile(tmp_path, FORGE_STDERR="1")}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    with FakeLark() as lark, FakeAnthropic() as model:
        server = ServerProcess(home, lark, model)
        server.start()
        try:
            await server.wait_ready(40)
            async with aiohttp.ClientSession() as http, http.get(server.url + "/healthz") as r:
                assert (await r.json())["mcp_servers"]["evil"]["ok"] is True
            def seen():   # in whatever form they reach the log (raw lines before the fix)
                text = server.log_path.read_text(encoding="utf-8", errors="replace")
                return "JSONRPC" in text and "flood line 40" in text
            await wait_until(seen, 20, "the server's stderr and the SDK's record")
            await asyncio.sleep(0.5)
            code, _ = await server.terminate()
            assert code == 0
        finally:
            server.close()
    entries = server.entries()
    assert not [e for e in entries if e.get("event") == "command.audited"]        # nothing forged
    assert not [e for e in entries if e.get("level") in ("raw", "cut") or e.get("format") == "stdlib-text"]
    stderr = [e for e in entries if e.get("event") == "mcp.stderr"]
    assert all(e["server"] == "evil" and len(e["line"]) <= 1000 for e in stderr)
    [forged] = [e for e in stderr if '"command.audited"' in e["line"]]
    assert json.loads(forged["line"])["event"] == "command.audited"            # kept, as a field
    assert [e for e in stderr if e["line"] == "plain words from the server, not JSON"]
    [long] = [e for e in stderr if e["line"].startswith("xxxx")]
    assert long.get("cut") is True and len(long["line"]) == 1000
    assert len(stderr) == 50                                                    # the rate bound
    dropped = sum(e["lines"] for e in entries if e.get("event") == "mcp.stderr_dropped")
    assert dropped == 2003 - 50
    [sdk] = [e for e in entries if e.get("event") == "mcp.sdk"]
    assert sdk["module"].startswith("mcp.") and "JSONRPC" in sdk["message"] and sdk["level"] == "error"
