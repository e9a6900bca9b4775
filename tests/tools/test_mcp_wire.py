"""MCP servers at the wire: a real server built with the ``mcp`` SDK (tests/tools/mcp_server.py)
as a stdio child of the app and over streamable HTTP on loopback; the model (fake, on both
adapters) calls its tools through the tool port; the bot answers through the fake Lark."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, tool_results
from tests.harness import Harness
from tests.reliability.support import ServerProcess, free_port

pytestmark = pytest.mark.usefixtures("model_provider")

SERVER = Path(__file__).with_name("mcp_server.py")
SERVER_TOOLS = 8       # the tools mcp_server.py lists before grow() adds one
ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


def stdio_config(tmp_path, **extra):
    return {"command": sys.executable, "args": [str(SERVER), "stdio"],
            "env": {"PID_FILE": str(tmp_path / "pids"), "EVENTS_FILE": str(tmp_path / "events")}, **extra}


def pids(tmp_path) -> list[int]:
    f = tmp_path / "pids"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:   # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def http_server(tmp_path):
    port = free_port()
    env = {**os.environ, "PID_FILE": str(tmp_path / "http_pids"), "EVENTS_FILE": str(tmp_path / "events")}
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


async def _ask(h, text, n, **who):
    await h.send_text(text, **who)
    [*_, last] = await h.replies(n, timeout=20)
    return last


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_tool_answers_the_user(tmp_path, transport, request):
    cfg = stdio_config(tmp_path) if transport == "stdio" else {"url": request.getfixturevalue("http_server")}
    async with Harness(tmp_path, mcp_servers={"team": cfg}) as h:
        h.model.script(ToolUse("mcp_team__lookup", {"q": "OKR"}))   # then the default: echo of the results
        reply = await _ask(h, "OKR 是什么意思？", 1, **ALICE)
        assert "GLOSSARY[OKR] = the answer from the server" in reply.text
        first = h.model.chat_requests()[0].json
        names = [t.get("name") or t.get("function", {}).get("name") for t in first["tools"]]
        assert {"memory_write", "mcp_team__lookup", "mcp_team__create_event"} <= set(names)
        async with h.http.get(h.url + "/healthz") as r:
            health = await r.json()
        assert health["mcp_servers"]["team"]["ok"] is True
        async with h.http.get(h.url + "/metrics") as r:
            metrics = await r.text()
        assert 'ethan_tool_calls_total{outcome="ok",tool="mcp_team__lookup"} 1.0' in metrics
        # the stored tool round trip, as `ethan session show` and the panel read it
        row = await h.app.db.fetchone("SELECT tool_calls FROM messages WHERE role='assistant'")
        assert "mcp_team__lookup" in row["tool_calls"] and "GLOSSARY[OKR]" in row["tool_calls"]


async def test_list_changed_refreshes_the_offer(tmp_path):
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)}) as h:
        h.model.script(ToolUse("mcp_team__grow", {}), Text("ok"), ToolUse("mcp_team__extra", {}))
        await _ask(h, "grow", 1, **ALICE)
        end = time.monotonic() + 10     # the list is read again within REFRESH_MIN_S (bot/tools/mcp.py)
        while h.app.mcp.status()["team"]["tools"] != SERVER_TOOLS + 1 and time.monotonic() < end:
            await asyncio.sleep(0.05)
        reply = await _ask(h, "extra", 2, **ALICE)
        assert "extra!" in reply.text


async def test_a_server_killed_mid_call_is_answered_and_restarted(tmp_path):
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)}) as h:
        [pid] = pids(tmp_path)
        h.model.script(ToolUse("mcp_team__slow", {"seconds": 8}), Text("抱歉，工具暂时不可用。"),
                       ToolUse("mcp_team__lookup", {"q": "again"}))
        await h.send_text("慢慢查一下", **ALICE)
        end = time.monotonic() + 10
        while not [r for r in h.model.chat_requests()] and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.8)            # the call is in flight
        os.kill(pid, signal.SIGKILL)
        [reply] = await h.replies(1, timeout=20)
        assert reply.text == "抱歉，工具暂时不可用。"
        [result] = tool_results(h.model.chat_requests()[1].json)
        assert result.get("is_error") and "stopped during the call" in str(result["content"])
        end = time.monotonic() + 15
        while not (len(pids(tmp_path)) == 2 and h.app.mcp.status()["team"]["ok"]) and time.monotonic() < end:
            await asyncio.sleep(0.1)
        assert h.app.mcp.status()["team"]["restarts"] >= 1 and not alive(pid)
        reply = await _ask(h, "再查一次", 2, **ALICE)
        assert f"pid {pids(tmp_path)[-1]}" in reply.text


async def test_a_hanging_tool_is_cut_at_its_timeout(tmp_path):
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path, timeout=1)}) as h:
        h.model.script(ToolUse("mcp_team__slow", {"seconds": 60}))
        t0 = time.monotonic()
        reply = await _ask(h, "等一下", 1, **ALICE)
        assert time.monotonic() - t0 < 8
        assert "did not answer within 1 s" in reply.text
        async with h.http.get(h.url + "/metrics") as r:
            assert 'ethan_tool_calls_total{outcome="timeout",tool="mcp_team__slow"} 1.0' in await r.text()


async def test_injection_in_a_result_arrives_fenced_and_changes_no_memory(tmp_path):
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)}) as h:
        h.model.script(ToolUse("mcp_team__weather", {"city": "Shanghai"}), Text("今天晴。"))
        await _ask(h, "上海天气？", 1, **ALICE)
        await h.idle()
        [result] = tool_results(h.model.chat_requests()[1].json)
        content = str(result["content"])
        assert content.startswith('<untrusted_content kind="tool" source="mcp_team__weather"')
        assert content.count("</untrusted_content>") == 1 and content.endswith("</untrusted_content>")
        assert "IGNORE PREVIOUS INSTRUCTIONS" in content and "&lt;/untrusted_content&gt;" in content
        for table in ("facts", "procedures"):
            assert (await h.app.db.fetchone(f"SELECT count(*) AS n FROM {table}"))["n"] == 0


async def test_a_server_that_fails_to_start_is_named_and_ethan_answers(tmp_path):
    bad = {"command": str(tmp_path / "no-such-server")}
    async with Harness(tmp_path, mcp_servers={"broken": bad, "team": stdio_config(tmp_path)}) as h:
        async with h.http.get(h.url + "/healthz") as r:
            health = await r.json()
        assert r.status == 200
        assert health["mcp_servers"]["broken"]["ok"] is False and health["mcp_servers"]["broken"]["problem"]
        assert health["mcp_servers"]["team"]["ok"] is True
        reply = await _ask(h, "你好", 1, **ALICE)
        assert reply.text.startswith("echo:")
        names = [t.get("name") or t.get("function", {}).get("name") for t in h.model.chat_requests()[0].json["tools"]]
        assert not any(n.startswith("mcp_broken__") for n in names) and "mcp_team__lookup" in names


@pytest.mark.parametrize("model_provider", ["anthropic"], indirect=True)
async def test_stdio_servers_die_with_a_sigkilled_ethan(tmp_path):
    import yaml
    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_lark import FakeLark

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump({"mcp_servers": {"team": stdio_config(tmp_path)}}))
    with FakeLark() as lark, FakeAnthropic() as model:
        server = ServerProcess(home, lark, model)
        server.start()
        try:
            await server.wait_ready(40)
            async with aiohttp.ClientSession() as http, http.get(server.url + "/healthz") as r:
                assert (await r.json())["mcp_servers"]["team"]["ok"] is True
            [pid] = pids(tmp_path)
            keeper = int(open(f"/proc/{pid}/stat").read().split(")")[-1].split()[1])   # its parent
            assert alive(pid) and alive(keeper)
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            end = time.monotonic() + 10
            while (alive(pid) or alive(keeper)) and time.monotonic() < end:
                await asyncio.sleep(0.05)
            assert not alive(pid) and not alive(keeper)
        finally:
            if server.proc and server.proc.poll() is None:
                server.proc.kill()


GROUP = dict(chat_id="oc_group_team", chat_type="group", sender="ou_alice")


async def test_side_effects_in_groups_are_off_by_default(tmp_path):
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path, read_only_tools=["lookup"])}) as h:
        await h.send_text("你好", **GROUP)
        await h.replies(1, timeout=20)
        names = [t.get("name") or t.get("function", {}).get("name") for t in h.model.chat_requests()[0].json["tools"]]
        assert "mcp_team__lookup" in names and "mcp_team__create_event" not in names
        assert "memory_write" in names


async def test_a_side_effecting_tool_in_a_group_runs_only_after_the_askers_click(tmp_path):
    import json as _json

    from tests.fakes.lark_events import make_card_action_event
    events = tmp_path / "events"
    async with Harness(tmp_path, mcp_servers={"team": stdio_config(tmp_path)},
                       tools={"side_effects_in_groups": True}) as h:
        h.model.script(ToolUse("mcp_team__create_event", {"title": "周会"}))
        await h.send_text("帮我建个周会", **GROUP)
        [card] = await h.replies(1, timeout=20)
        assert card.msg_type == "interactive" and "mcp_team__create_event" in _json.dumps(card.content, ensure_ascii=False)
        value = next(b["behaviors"][0]["value"] for b in _buttons(card.content) if b["behaviors"][0]["value"]["ethan"] == "tool_confirm")
        async def click(who):
            status, _ = await h.post(make_card_action_event(value, chat_id=GROUP["chat_id"], message_id=card.message_id,
                                                            operator=who))
            assert status == 200
        await click("ou_bob")                  # not the asker: nothing runs
        await asyncio.sleep(1.0)
        assert not events.exists() and len(h.lark.messages()) == 1
        await click("ou_alice")
        [_, reply] = await h.replies(2, timeout=20)
        assert "created event '周会'" in reply.text
        assert events.read_text(encoding="utf-8").split() == ["周会"]


def _buttons(content):
    out = []
    def walk(x):
        if isinstance(x, dict):
            if x.get("tag") == "button":
                out.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(content)
    return out
