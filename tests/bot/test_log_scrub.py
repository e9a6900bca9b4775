"""The log scrubber hides secrets but not token counts (it once printed input_tokens as
"[redacted]" because the key contains "token")."""

import logging

import pytest
import structlog

from bot.infra.log import _scrub


def test_secrets_hidden_token_counts_kept():
    line = _scrub(None, "info", {"event": "agent.replied", "input_tokens": 754, "cache_read_tokens": 0,
                                 "api_token": "t-" + "a" * 40, "note": "key sk-ant-abcdefgh123"})
    assert line["input_tokens"] == 754 and line["cache_read_tokens"] == 0
    assert line["api_token"] == "[redacted]"
    assert "sk-ant-" not in line["note"]


class _Lines:
    def __init__(self) -> None:
        self.text = ""

    def write(self, t: str) -> int:
        self.text += t
        return len(t)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@pytest.fixture
def restored_logging():
    """configure_logging sets the process's logging up; the test run's is put back after."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    lark = logging.getLogger("Lark")
    lark_handlers = list(lark.handlers)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    lark.handlers[:] = lark_handlers
    structlog.configure(**config)


def test_stdlib_records_and_the_lark_sdks_are_json_lines_scrubbed(restored_logging, capsys):
    """Issue 45 N13: a stdlib record (memory/'s, a library's) is a JSON line with its logger's
    name, its extra= fields and its traceback, scrubbed; lark-oapi's own stdout handler (it
    printed ``[Lark] [time] [WARNING] …``) is taken away once the SDK is imported."""
    import json

    from bot.lark.transport.compat import session_class
    from bot.infra.log import configure_logging

    out = _Lines()
    logging.getLogger().handlers[:] = []          # as in a fresh process (basicConfig adds ours then)
    configure_logging("info", json=True, stream=out)
    session_class()          # imports the SDK, which installs its handler, and adopts it
    logging.getLogger("ethan.working").warning("working.replay_trimmed", extra={"session_id": "s_1", "trimmed": 2})
    try:
        raise ValueError("connect to postgresql://ethan:s3cretpw@db/ethan failed")
    except ValueError:
        logging.getLogger("psycopg.pool").exception("pool failed\nagain")
    logging.getLogger("Lark").warning("connect failed, err: boom")
    lines = out.text.splitlines()
    assert len(lines) == 3 and "s3cretpw" not in out.text
    trimmed, pool, lark = (json.loads(line) for line in lines)
    assert (trimmed["event"], trimmed["logger"], trimmed["session_id"], trimmed["trimmed"]) == \
        ("working.replay_trimmed", "ethan.working", "s_1", 2)
    assert pool["logger"] == "psycopg.pool" and "ValueError" in pool["exception"]
    assert (lark["logger"], lark["level"]) == ("Lark", "warning")
    assert capsys.readouterr().out == ""


def test_a_closed_log_pipe_drops_and_counts_lines_and_never_raises(restored_logging, monkeypatch):
    """(issue 52) stderr a pipe whose reader is gone, then a closed file: structlog's lines and
    a library's stdlib record are dropped and counted, never raised into the caller; the dead
    descriptor then points at /dev/null, so a direct write to it (the interpreter's flush at
    exit) no longer fails either. tests/test_deploy.py drives the same through `ethan serve`."""
    import io
    import os
    import sys

    from bot.infra.log import configure_logging, dropped_lines, get_logger

    read_end, write_end = os.pipe()
    pipe = os.fdopen(write_end, "w", buffering=1)
    os.close(read_end)                          # the reader exits, as tee does
    monkeypatch.setattr(sys, "stderr", pipe)
    logging.getLogger().handlers[:] = []
    configure_logging("info", json=True)
    before = dropped_lines()
    log = get_logger("ethan.test")
    log.info("first.line", chat_id="oc_1")     # EPIPE here: given up, counted
    log.info("second.line", chat_id="oc_1")    # the stream is given up: counted, not written
    logging.getLogger("psycopg.pool").warning("pool trouble")
    assert dropped_lines() == before + 3
    os.write(write_end, b"after\n")              # /dev/null now: no EPIPE
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)  # another stream, closed: ValueError, counted
    log.warning("third.line")
    assert dropped_lines() == before + 4
    pipe.close()
