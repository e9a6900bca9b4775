"""The stdio MCP server's keeper: ``python -m bot.tools.mcp_child <command> <args…>``.

Why: an MCP server started over stdio must never outlive Ethan, also when Ethan is killed
with SIGKILL (no clean-up code runs then). Linux's ``PR_SET_PDEATHSIG`` makes the kernel
signal a process when its parent dies, so this keeper:

1. asks for SIGTERM when Ethan (its parent) dies, and exits at once if Ethan is already gone;
2. runs the server as its child (the server's stdio are the keeper's: Ethan talks to it
   directly) — the child also asks for SIGKILL when the keeper dies;
3. when Ethan dies (SIGTERM from the kernel) or the server exits or is killed, kills the whole
   process group (``stdio_client`` starts the keeper in its own session, so a server's own
   children — ``npx`` → ``node`` — are in it) and exits; Ethan sees the pipe close and restarts
   the server (bot/tools/mcp.py).

Elsewhere than Linux there is no PDEATHSIG: the keeper polls its parent id once a second.

Its stderr and the server's are a pipe to Ethan, which logs each line as an ``mcp.stderr``
record naming the server (bot/tools/mcp.py ``_StderrLines``): what is printed here is data in
Ethan's log, never a log line of its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def _pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill_group() -> None:
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)   # the keeper itself is in it: ends here
    except OSError:
        pass
    os._exit(1)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bot.tools.mcp_child <command> [args…]", file=sys.stderr)
        return 2
    parent = int(os.environ.pop("ETHAN_MCP_PARENT", "0") or 0) or os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: _kill_group())
    watched = _pdeathsig(signal.SIGTERM)
    if os.getppid() != parent:        # Ethan died before the request took effect
        _kill_group()
    if not watched:
        def poll() -> None:
            while True:
                if os.getppid() != parent:
                    _kill_group()
                time.sleep(1.0)
        threading.Thread(target=poll, daemon=True).start()
    pid = os.fork()
    if pid == 0:
        keeper = os.getppid()
        _pdeathsig(signal.SIGKILL)
        if os.getppid() != keeper:
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"mcp server {argv[0]!r} could not start: {e}", file=sys.stderr)
            os._exit(127)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    # The server is gone: anything it started goes with it, then the keeper.
    try:
        os.killpg(os.getpgrp(), 0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except OSError:
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
