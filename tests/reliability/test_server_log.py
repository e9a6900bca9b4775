"""The crash tests read the killed server's log: a SIGKILL may cut its last line.

``ServerProcess`` runs a stand-in process here (a few lines of Python writing what the
server's logger writes: ``print()`` of a JSON line, which is two writes, the line and then
its newline) so the cut is made on purpose instead of by chance.
"""

from __future__ import annotations

import sys

import aiohttp

from tests.fakes.fake_anthropic import Error
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import ServerProcess, _is_json_object, post_event, wait_until

TRACEBACK = "Traceback (most recent call last):"


def writes_then_sleeps(text: str) -> list[str]:
    code = f"import sys, time\nsys.stderr.write({text!r})\nsys.stderr.flush()\ntime.sleep(60)\n"
    return [sys.executable, "-c", code]


async def test_a_line_cut_by_sigkill_is_not_an_error_but_a_traceback_is(tmp_path, lark, model):
    srv = ServerProcess(tmp_path, lark, model)
    try:
        # run 1: killed in the middle of writing a line, after a traceback Python printed
        srv.command = writes_then_sleeps('{"event": "a", "level": "info"}\n' + TRACEBACK + "\n"
                                         '{"event": "app.rea')
        srv.start()
        await wait_until(lambda: srv.log_path.read_bytes().endswith(b'"app.rea'), 30, "the cut line")
        srv.kill()
        # run 2: killed between the line and its newline
        srv.command = writes_then_sleeps('{"event": "b", "level": "error"}')
        srv.start()
        await wait_until(lambda: srv.log_path.read_bytes().endswith(b'"error"}'), 30, "the line")
        srv.kill()
        # run 3: a normal start after the kills
        srv.command = [sys.executable, "-c", 'print(\'{"event": "c", "level": "info"}\')']
        srv.start()
        await wait_until(lambda: srv.proc.poll() is not None, 30, "run 3 to exit")
        srv.close()

        events = [e["event"] for e in srv.entries()]
        assert events == ["test.server_start", "a", TRACEBACK, '{"event": "app.rea', "test.server_killed",
                          "test.server_start", "b", "test.server_killed", "test.server_start", "c"]
        # the traceback and the error line count; the cut line does not
        assert [e["event"] for e in srv.errors()] == [TRACEBACK, "b"]
    finally:
        srv.close()


async def test_stdlib_log_lines_of_a_serving_process_are_json(server, lark, model):
    """Issue 45 N13: memory/ logs through stdlib logging (it must not import bot/); its lines,
    like a library's, came out as ``WARNING:ethan.working:…`` text. Here consolidation keeps
    failing, the session's backlog outgrows the replay budget and memory/working/view.py warns
    (``working.replay_trimmed``): every line of the server's output is a JSON object, that one
    with its logger's name and its fields as keys."""
    model.clear()      # no summaries: the consolidator's every attempt fails
    model.on_tool("write_summary", Error.invalid_request("summaries are refused in this test"), keys={"summary"})
    srv = server()
    await srv.start_ready()
    async with aiohttp.ClientSession() as http:
        for i in range(16):    # 14 turns are always replayed; ~2,000 tokens a turn passes the 24k budget
            event = make_text_event(f"第 {i} 条：" + "长" * 1000, chat_id="oc_p2p_alice", sender="ou_alice")
            lark.register_inbound(event)
            assert await post_event(http, srv.url, event) == 200
            await lark.wait_for_messages_async(i + 1, timeout=30)
    await wait_until(lambda: any("working.replay_trimmed" in line for line in srv.lines()), 20,
                     "the replay_trimmed warning")
    await srv.terminate()
    raw = [line for line in srv.lines() if line.strip() and not _is_json_object(line)]
    assert raw == [], raw[:5]
    [trimmed] = [e for e in srv.entries() if e.get("event") == "working.replay_trimmed"]
    assert trimmed["logger"] == "ethan.working" and trimmed["level"] == "warning"
    assert trimmed["trimmed"] >= 1 and trimmed["session_id"].startswith("s_") and "failures" in trimmed
