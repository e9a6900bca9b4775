"""The crash tests read the killed server's log: a SIGKILL may cut its last line.

``ServerProcess`` runs a stand-in process here (a few lines of Python writing what the
server's logger writes: ``print()`` of a JSON line, which is two writes, the line and then
its newline) so the cut is made on purpose instead of by chance.
"""

from __future__ import annotations

import sys

from tests.reliability.support import ServerProcess, wait_until

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
