"""The ``ethan`` command: terminal chat (and resume), session commands, memory export/import,
backup, help and errors.

The chat runs as a real subprocess (``python -m bot``) in a clean environment — no
ANTHROPIC_API_KEY, so the built-in offline model answers over loopback; no LARK_* — with
ETHAN_HOME in a temporary directory. The commands that only open the database run
in-process through ``bot.infra.cli.main`` (faster), against sessions seeded with known ids.
"""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import structlog

from bot.infra.cli import main
from storage.sqlite import SqliteDatabase
from memory.governance.export_format import FILES, MANIFEST
from memory.scope import Scope
from memory.sessions.store import SessionStore

REPO = Path(__file__).resolve().parents[1]
LOCAL = "ou_local"
CLI_CHAT = "oc_cli_ou_local"
TEA = "记住我喜欢乌龙茶"
QUESTION = "我喜欢什么？"


# -- helpers -------------------------------------------------------------------------------

def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ETHAN_HOME": str(home / "data"),
           "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def ethan(home: Path, *args: str, input: str | None = None, timeout: float = 120, **env: str):
    """``python -m bot ARGS`` in a clean environment, in ``home`` (so no stray .env is read)."""
    return subprocess.run([sys.executable, "-m", "bot", *args], input=input, capture_output=True, text=True,
                          encoding="utf-8", cwd=home, env=clean_env(home, **env), timeout=timeout)


def db_rows(path: Path, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def one_line_error(result_or_err: str) -> None:
    text = result_or_err.strip()
    assert text and "\n" not in text, text
    assert "Traceback" not in text


class Tails:
    """An rng for SessionStore that hands out the session-id tails we choose."""

    def __init__(self, *tails: str) -> None:
        self.tails = list(tails)

    def getrandbits(self, _bits: int) -> int:
        return int(self.tails.pop(0), 16)


# -- the terminal chat (subprocess) ----------------------------------------------------------

@pytest.fixture(scope="module")
def chatted(tmp_path_factory):
    """One `ethan chat` run with piped input; later tests read (or copy) its home."""
    home = tmp_path_factory.mktemp("cli")
    result = ethan(home, "chat", input=f"{TEA}\n{QUESTION}\n/exit\n")
    return home, result


def test_chat_answers_twice_and_closes_the_session_with_its_episode(chatted):
    home, r = chatted
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    answers = [line for line in r.stdout.splitlines() if line.startswith("ethan> ")]
    assert len(answers) == 2 and all("[offline]" in a for a in answers), r.stdout
    assert "乌龙茶" in r.stdout.split("ethan> ")[2]                 # the second answer knows the fact
    m = re.search(r"Session (s_\d{8}_\d{4}_[0-9a-f]{4}) saved \(2 turns\)", r.stderr)
    assert m, r.stderr
    db = home / "data" / "ethan.db"
    [s] = db_rows(db, "SELECT * FROM sessions")
    assert s["id"] == m.group(1) and s["chat_id"] == CLI_CHAT and s["chat_type"] == "p2p"
    assert s["closed_at"] is not None and s["user_turns"] == 2 and s["message_count"] == 4
    [ep] = db_rows(db, "SELECT * FROM episodes")                     # spec: CLI exit with >= 2 turns
    assert ep["session_id"] == s["id"] and ep["user_id"] == LOCAL and ep["turn_count"] == 2
    # the offline model wrote it and says so (issue 19: it recorded claude-haiku-4-5)
    assert ep["model"] == "ethan-offline" and s["model"] == "ethan-offline"
    assert ep["started_at"] and ep["ended_at"] >= ep["started_at"]
    assert db_rows(db, "SELECT COUNT(*) AS n FROM episode_chunks")[0]["n"] >= 1
    assert [f["content"] for f in db_rows(db, "SELECT content FROM facts WHERE user_id = ?", (LOCAL,))] \
        == ["用户喜欢乌龙茶"]
    assert (home / "data" / "logs" / "cli.log").stat().st_size > 0   # logs kept off the terminal
    assert "app.ready" not in r.stderr


def test_the_terminal_chat_writes_nothing_to_larks_inbox(chatted):
    """A peer of Lark (issue 18): its messages are its own, not made-up Lark events."""
    home, _ = chatted
    db = home / "data" / "ethan.db"
    assert db_rows(db, "SELECT COUNT(*) AS n FROM inbox")[0]["n"] == 0
    assert [r["lark_message_id"][:7] for r in db_rows(db, "SELECT lark_message_id FROM messages WHERE role = 'user'")] \
        == ["om_cli_", "om_cli_"]


def test_session_list_shows_the_chat(chatted):
    home, _ = chatted
    r = ethan(home, "session", "list")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["ID", "UPDATED", "MSGS", "CHAT", "TITLE"]
    assert re.match(r"s_\d{8}_\d{4}_[0-9a-f]{4} ", row)
    assert f"p2p {CLI_CHAT}" in row and row.rstrip().endswith(TEA) and " 4 " in row


def test_resume_last_continues_the_same_session(chatted, tmp_path):
    home = tmp_path / "copy"
    shutil.copytree(chatted[0], home)
    db = home / "data" / "ethan.db"
    [before] = db_rows(db, "SELECT id FROM sessions")
    r = ethan(home, "-r", "last", input="/sessions\n我们刚才聊了什么？\n")       # EOF ends the chat
    assert r.returncode == 0, r.stderr
    assert f"Resumed session {before['id']} (2 turns)" in r.stderr
    assert f"you> {TEA}" in r.stdout                                   # the history is shown
    assert re.search(rf"▶ {before['id'][-4:]}\s", r.stdout)            # /sessions: it is the current one
    assert r.stdout.count("[offline]") >= 3                           # 2 in the recap + the new answer
    [after] = db_rows(db, "SELECT * FROM sessions")                   # no new session: the same one went on
    assert after["id"] == before["id"] and after["user_turns"] == 3 and after["message_count"] == 6
    assert after["closed_at"] is not None
    [ep] = db_rows(db, "SELECT turn_count FROM episodes WHERE session_id = ?", (before["id"],))
    assert ep["turn_count"] == 3                                      # the episode follows the session

    bad = ethan(home, "-r", "zzzz", input="")
    assert bad.returncode == 2
    one_line_error(bad.stderr)
    assert "no session 'zzzz'" in bad.stderr and bad.stdout == ""


def test_memory_export_writes_the_four_files_with_the_fact(chatted, tmp_path):
    home, _ = chatted
    out = tmp_path / "export"
    r = ethan(home, "memory", "export", "--user", LOCAL, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "1 facts" in r.stdout
    for name in FILES:
        assert (out / name).is_file(), name
    facts = json.loads((out / "facts.json").read_text(encoding="utf-8"))
    assert [f["content"] for f in facts] == ["用户喜欢乌龙茶"]
    assert {"content", "category", "confidence", "source", "created_at", "last_accessed", "hit_count"} <= set(facts[0])
    episodes = json.loads((out / "episodes.json").read_text(encoding="utf-8"))
    assert len(episodes) == 1 and episodes[0]["turn_count"] == 2
    assert json.loads((out / MANIFEST).read_text(encoding="utf-8"))["user_id"] == LOCAL


def test_help_lists_every_command_and_ethan_equals_python_m_bot(tmp_path):
    r = ethan(tmp_path, "--help")
    assert r.returncode == 0
    for word in ("serve", "chat", "session", "memory", "backup", "-r ID", "--user", "export", "import"):
        assert word in r.stdout, word
    script = Path(sys.executable).with_name("ethan")
    if script.exists():
        same = subprocess.run([str(script), "--help"], capture_output=True, text=True, encoding="utf-8",
                              cwd=tmp_path, env=clean_env(tmp_path))
        assert same.stdout == r.stdout
    sub = ethan(tmp_path, "session", "--help")
    assert all(w in sub.stdout for w in ("list", "show", "delete", "search"))


# -- in-process commands --------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _keep_logging():
    """bot.infra.cli.main configures logging for the process; put the test run's back afterwards."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.upper().startswith(("ETHAN_", "LARK_", "ANTHROPIC_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


LONG = "乌龙茶" + "很好喝" * 150


async def _seed(path: Path) -> dict[str, str]:
    db = await SqliteDatabase(path).open()
    try:
        store = SessionStore(db, rng=Tails("ab12", "cd12", "ef34", "0a56"))
        alice = Scope(user_id="ou_alice", chat_id="oc_alice_dm", chat_type="p2p")
        team = Scope(user_id="ou_bob", chat_id="oc_team", chat_type="group")
        local = Scope(user_id=LOCAL, chat_id=CLI_CHAT, chat_type="p2p")
        a = (await store.append_user(alice, "我想学做乌龙茶", sender_name="Alice")).session
        await store.append_assistant(a.id, "好的，先从温杯开始。")
        await store.append_user(alice, LONG)
        await store.close_active(alice.conv_key)
        b = (await store.append_user(team, "发布计划讨论", sender_name="Bob")).session
        await store.append_assistant(b.id, "收到")
        c = (await store.append_user(local, "本地会话一")).session
        await store.close_active(local.conv_key)
        d = (await store.append_user(local, "本地会话二")).session
        await store.close_active(local.conv_key)
        # what was derived from Alice's session: her episode, a fact learned only there, and
        # a fact also learned in another session (which stays when the session is deleted)
        from memory.episodes.store import EpisodeStore
        from memory.facts.store import FactStore

        await EpisodeStore(db).write(session_id=a.id, user_id="ou_alice", chat_id="oc_alice_dm", chat_type="p2p",
                                     summary="Alice 想学做乌龙茶。", turn_count=2,
                                     turns=["我想学做乌龙茶", "温杯用的是紫砂壶"])
        facts = FactStore(db)
        await facts.add(alice, "用户想学做乌龙茶", "preference", source="consolidator", session_id=a.id)
        await facts.add(alice, "用户住在杭州", "knowledge", source="consolidator", session_id=a.id)
        await facts.add(alice, "用户住在杭州", "knowledge", source="consolidator", session_id=c.id)
        # and likewise a profile entry taught only there, one also taught in another session
        from memory.profile.store import ProfileStore

        profile = ProfileStore(db)
        await profile.update(alice, "goals", "学会做乌龙茶", session_id=a.id)
        await profile.update(alice, "identity", "住在杭州", session_id=a.id)
        await profile.update(alice, "identity", "住在杭州", session_id=c.id)
        return {"alice": a.id, "team": b.id, "local1": c.id, "local2": d.id}
    finally:
        await db.close()


@pytest.fixture
def seeded(home):
    import asyncio

    return asyncio.run(_seed(home / "ethan.db"))


def test_session_list_filters_by_user_and_limits(seeded, capsys):
    assert main(["session", "list"]) == 0
    out = capsys.readouterr().out
    assert all(sid in out for sid in seeded.values())
    assert main(["session", "list", "--user", "ou_bob"]) == 0
    out = capsys.readouterr().out
    assert seeded["team"] in out and seeded["alice"] not in out and "group oc_team" in out
    assert "(* open" in out                                            # the team session is still open
    assert main(["session", "list", "--limit", "1"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2       # header + one
    assert main(["session", "list", "--user", "ou_nobody"]) == 0
    assert "no sessions" in capsys.readouterr().out


def test_session_show_summarises_messages(seeded, capsys):
    assert main(["session", "show", "ab12"]) == 0
    out = capsys.readouterr().out
    assert f"session  {seeded['alice']}" in out and "chat     p2p oc_alice_dm" in out
    assert "status   closed" in out and "messages 3 (2 from users)" in out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] user \(Alice\): 我想学做乌龙茶$", lines[0])
    assert "assistant: 好的，先从温杯开始。" in lines[1]
    assert lines[2].endswith("…") and len(lines[2].split(": ", 1)[1]) == 200          # first 200 characters
    assert main(["session", "show", seeded["team"]]) == 0                             # full id
    assert "status   open" in capsys.readouterr().out


def test_unknown_and_ambiguous_ids_exit_2_with_a_clear_message(seeded, capsys):
    assert main(["session", "show", "zzzz"]) == 2
    err = capsys.readouterr().err
    one_line_error(err)
    assert "no session matches 'zzzz'" in err
    assert main(["session", "show", "12"]) == 2                          # ab12 and cd12
    err = capsys.readouterr().err
    assert "'12' matches 2 sessions" in err and seeded["alice"] in err and seeded["team"] in err
    assert "Traceback" not in err
    assert main(["session", "show", "ab12", "--user", "ou_bob"]) == 2    # not one of Bob's
    one_line_error(capsys.readouterr().err)
    assert main(["session", "delete", "nope", "--yes"]) == 2
    one_line_error(capsys.readouterr().err)
    assert main(["session", "delete", "last", "--yes"]) == 2
    one_line_error(capsys.readouterr().err)
    assert main(["session", "list", "--user", "not a user"]) == 2
    one_line_error(capsys.readouterr().err)
    # -r in the terminal chat: unknown → one line, exit 2, and no chat
    assert main(["-r", "x9"]) == 2
    captured = capsys.readouterr()
    one_line_error(captured.err)
    assert captured.out == ""


def test_resume_with_an_ambiguous_tail_lists_the_candidates(home, capsys):
    import asyncio

    async def seed() -> list[str]:
        db = await SqliteDatabase(home / "ethan.db").open()
        try:
            store = SessionStore(db, rng=Tails("aa77", "bb77"))
            local = Scope(user_id=LOCAL, chat_id=CLI_CHAT, chat_type="p2p")
            ids = []
            for text in ("第一次", "第二次"):
                ids.append((await store.append_user(local, text)).session.id)
                await store.close_active(local.conv_key)
            return ids
        finally:
            await db.close()

    ids = asyncio.run(seed())
    assert main(["-r", "77"]) == 2
    captured = capsys.readouterr()
    assert "'77' matches 2 sessions" in captured.err and all(i in captured.err for i in ids)
    assert captured.out == ""


def test_session_delete_asks_first(seeded, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["session", "delete", "ab12"]) == 1
    captured = capsys.readouterr()
    assert "[y/N]" in captured.err and "not deleted" in captured.out
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))                 # no answer (EOF) is no
    assert main(["session", "delete", "ab12"]) == 1
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert main(["session", "delete", "ab12"]) == 0
    assert (f"deleted session {seeded['alice']} (3 messages, 1 episodes, 0 summaries, 1 facts and 1 profile "
            "entries learned only there)" in capsys.readouterr().out)
    home = Path(os.environ["ETHAN_HOME"]) / "ethan.db"
    assert db_rows(home, "SELECT COUNT(*) AS n FROM episodes")[0]["n"] == 0
    assert [r["content"] for r in db_rows(home, "SELECT content FROM facts")] == ["用户住在杭州"]
    assert [r["entry"] for r in db_rows(home, "SELECT entry FROM profile_entries")] == ["住在杭州"]
    assert main(["session", "delete", "cd12", "--yes"]) == 0
    capsys.readouterr()
    rows = db_rows(Path(os.environ["ETHAN_HOME"]) / "ethan.db", "SELECT id FROM sessions")
    assert {r["id"] for r in rows} == {seeded["local1"], seeded["local2"]}
    assert db_rows(Path(os.environ["ETHAN_HOME"]) / "ethan.db",
                   "SELECT COUNT(*) AS n FROM messages WHERE session_id = ?", (seeded["alice"],))[0]["n"] == 0


def test_session_search(seeded, capsys):
    assert main(["session", "search", "乌龙"]) == 0
    out = capsys.readouterr().out
    assert seeded["alice"] in out and seeded["team"] not in out and "乌龙茶" in out
    assert main(["session", "search", "乌龙", "--user", "ou_bob"]) == 0          # Bob never talked about it
    assert "no session matches" in capsys.readouterr().out
    assert main(["session", "search", "发布", "计划"]) == 0                       # words joined into one phrase
    assert main(["session", "search", "   "]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "ethan: empty query: type a word or phrase to search for"


def test_commands_without_a_database_say_so(home, capsys):
    assert main(["session", "list"]) == 1
    err = capsys.readouterr().err
    one_line_error(err)
    assert "no database at" in err
    assert not (home / "ethan.db").exists()                            # nothing created by a read


def test_configuration_errors_stay_one_line(home, capsys, monkeypatch):
    monkeypatch.setenv("ETHAN_PORT", "not-a-port")
    assert main(["session", "list"]) == 2
    err = capsys.readouterr().err
    one_line_error(err)
    assert err.startswith("ethan: configuration error: ETHAN_PORT")


def test_chat_in_process_with_the_configured_user_and_new(home, capsys, monkeypatch):
    """ETHAN_LOCAL_USER picks the user; /new ends a session (its episode is written) and the
    next message starts another; a one-turn session leaves no episode."""
    monkeypatch.setenv("ETHAN_LOCAL_USER", "ou_alice")
    monkeypatch.setattr(sys, "stdin", io.StringIO("你好，我是林一\n今天想聊聊乌龙茶\n/new\n再问一句\n"))
    assert main(["chat"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("[offline]") == 3
    assert "已结束会话" in captured.out                                  # /new answered by bot/commands/sessions.py
    db = home / "ethan.db"
    sessions = db_rows(db, "SELECT id, chat_id, user_turns, closed_at FROM sessions ORDER BY created_at, id")
    assert [(s["chat_id"], s["user_turns"]) for s in sessions] == [("oc_cli_ou_alice", 2), ("oc_cli_ou_alice", 1)]
    assert all(s["closed_at"] is not None for s in sessions)
    episodes = db_rows(db, "SELECT session_id, user_id FROM episodes")
    assert [(e["session_id"], e["user_id"]) for e in episodes] == [(sessions[0]["id"], "ou_alice")]

    monkeypatch.setattr(sys, "stdin", io.StringIO("/sessions\n/exit\n"))
    assert main(["chat", "--user", "ou_bob"]) == 0                    # --user wins; Bob has nothing here
    assert "ethan> No sessions in this conversation yet." in capsys.readouterr().out


class FeedStdin:
    """A piped stdin the test writes to line by line."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str] = queue.Queue()

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        return self.lines.get(timeout=60)

    def feed(self, line: str) -> None:
        self.lines.put(line + "\n")


async def until(predicate, timeout: float = 30.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_leaving_the_chat_closes_the_session_and_writes_its_episode(home):
    """Nothing else is pending when the user leaves: the episode comes from leaving itself."""
    import asyncio

    from bot.infra.config import load_settings
    from bot.infra.terminal import TerminalChat

    stdin, out = FeedStdin(), io.StringIO()
    chat = TerminalChat(load_settings(), user_id="ou_carol", stdin=stdin, stdout=out, stderr=io.StringIO())
    task = asyncio.create_task(chat.run())
    stdin.feed("我叫卡罗尔")
    await until(lambda: out.getvalue().count("ethan> ") == 1)
    stdin.feed("今天想聊聊乌龙茶")
    await until(lambda: out.getvalue().count("ethan> ") == 2)
    await chat.app.queue.wait_idle()
    session = await chat.app.memory.sessions.active("oc_cli_ou_carol")
    assert session is not None and session.user_turns == 2
    assert await chat.app.memory.episodes.count("ou_carol") == 0     # not before the session ends
    stdin.feed("/exit")
    outcome = await asyncio.wait_for(task, 60)
    assert outcome.session_id == session.id and outcome.turns == 2
    rows = db_rows(home / "ethan.db", "SELECT closed_at FROM sessions WHERE id = ?", (session.id,))
    assert rows[0]["closed_at"] is not None
    [ep] = db_rows(home / "ethan.db", "SELECT session_id, turn_count FROM episodes WHERE user_id = 'ou_carol'")
    assert ep["session_id"] == session.id and ep["turn_count"] == 2


class TtyOut(io.StringIO):
    """A terminal's stdout (isatty: the chat streams the answer as it arrives)."""

    def isatty(self) -> bool:
        return True


async def test_a_streamed_answer_whose_deltas_end_in_a_space_is_printed_once(home, monkeypatch):
    """Issue 52: the tool loop strips the answer, the stream kept its trailing space, and
    finish() printed the whole answer again on a new line."""
    import asyncio

    from bot.infra.config import load_settings
    from bot.infra.terminal import TerminalChat
    from tests.fakes.fake_anthropic import FakeAnthropic, Text

    with FakeAnthropic() as fake:
        fake.stream_chunks = 3                       # "Hell" "o th" "ere ": the last delta ends in a space
        fake.script(Text("Hello there "), Text("Second answer "))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        stdin, out = FeedStdin(), TtyOut()
        chat = TerminalChat(load_settings(), user_id="ou_dana", stdin=stdin, stdout=out, stderr=io.StringIO())
        task = asyncio.create_task(chat.run())
        stdin.feed("hi")
        await until(lambda: out.getvalue().endswith("\n") and "Hello there" in out.getvalue())
        stdin.feed("again")
        await until(lambda: "Second answer" in out.getvalue() and out.getvalue().endswith("\n"))
        stdin.feed("/exit")
        await asyncio.wait_for(task, 60)
    assert [r.stream for r in fake.requests if r.kind == "chat"] == [True, True]
    screen = out.getvalue()
    assert screen.count("Hello there") == 1 and screen.count("Second answer") == 1, screen
    assert screen.count("ethan> ") == 2, screen


# -- memory import through the CLI ------------------------------------------------------------

def test_memory_import_cli_round_trip_and_refusal(home, tmp_path, capsys, monkeypatch):
    import asyncio

    from memory.facts.store import FactStore

    async def seed() -> None:
        db = await SqliteDatabase(home / "ethan.db").open()
        try:
            await FactStore(db).add(Scope(user_id="ou_alice", chat_id="oc_a", chat_type="p2p"),
                                    "用户喜欢乌龙茶", "preference", source="agent_proactive")
        finally:
            await db.close()

    asyncio.run(seed())
    out = tmp_path / "exp"
    assert main(["memory", "export", "--user", "ou_alice", "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path / "other"))           # a fresh database
    assert main(["memory", "import", "--user", "ou_alice", str(out)]) == 0
    assert "facts            1 added, 0 already there" in capsys.readouterr().out
    assert main(["memory", "import", "--user", "ou_alice", str(out)]) == 0
    assert "facts            0 added, 1 already there" in capsys.readouterr().out
    again = tmp_path / "again"
    assert main(["memory", "export", "--user", "ou_alice", "--out", str(again)]) == 0
    assert all((out / n).read_bytes() == (again / n).read_bytes() for n in (*FILES, MANIFEST))

    (out / "episodes.json").write_text('[{"session_id": "s1", "summary": "x", "timestamp": 1}]', encoding="utf-8")
    capsys.readouterr()
    assert main(["memory", "import", "--user", "ou_bob", str(out)]) == 2
    err = capsys.readouterr().err
    one_line_error(err)
    assert err.startswith("ethan: import refused, nothing was imported: episodes.json: episode 1: turn_count")
    assert db_rows(tmp_path / "other" / "ethan.db", "SELECT COUNT(*) AS n FROM facts WHERE user_id = 'ou_bob'")[0]["n"] == 0

    (tmp_path / "file").write_text("x")
    assert main(["memory", "export", "--user", "ou_alice", "--out", str(tmp_path / "file")]) == 2
    one_line_error(capsys.readouterr().err)


# -- backup ------------------------------------------------------------------------------------

BATCH = 50


def _writer(path: Path, stop: threading.Event, done: list[int]) -> None:
    """Another connection writing facts in transactions of BATCH rows, as fast as it can."""
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        n = 0
        while not stop.is_set():
            conn.execute("BEGIN IMMEDIATE")
            now = time.time()
            conn.executemany(
                "INSERT INTO facts(user_id, content, norm, category, confidence, source, created_at, updated_at,"
                " last_accessed) VALUES ('ou_writer', ?, ?, 'knowledge', 0.8, 'consolidator', ?, ?, ?)",
                [(f"fact {n + i}", f"fact{n + i}", now, now, now) for i in range(BATCH)])
            conn.execute("COMMIT")
            n += BATCH
        done.append(n)
    finally:
        conn.close()


def test_backup_on_postgresql_says_use_pg_dump_in_one_line(home, tmp_path, monkeypatch, capsys):
    """(issue 30) It died with AttributeError; no server is contacted to say so."""
    monkeypatch.setenv("ETHAN_DATABASE_URL", "postgresql://ethan:secret@127.0.0.1:1/ethan")
    assert main(["backup", str(tmp_path / "copy.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pg_dump" in err and "Traceback" not in err
    assert "secret" not in err and "PostgreSQL 127.0.0.1:1/ethan" in err
    assert not (tmp_path / "copy.db").exists()


def test_db_copy_to_a_bad_url_is_one_line_without_the_password(seeded, capsys):
    """(issue 45 N13) An unknown query parameter reached psycopg as a keyword: a traceback."""
    assert main(["db", "copy", "--to", "postgresql://ethan:s3cretpw@127.0.0.1:1/ethan?foo=bar"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'foo' in the URL's query" in err and "Traceback" not in err
    assert "s3cretpw" not in err


def test_backup_while_another_connection_writes(home, tmp_path, capsys):
    import asyncio

    asyncio.run(_seed(home / "ethan.db"))
    stop, done = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(home / "ethan.db", stop, done))
    writer.start()
    try:
        time.sleep(0.2)
        target = tmp_path / "backups" / "copy.db"
        assert main(["backup", str(target)]) == 0
        out = capsys.readouterr().out
        time.sleep(0.1)
    finally:
        stop.set()
        writer.join(10)
    assert str(target) in out and f"{target.stat().st_size} bytes" in out and "integrity ok" in out
    conn = sqlite3.connect(target)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        copied = conn.execute("SELECT COUNT(*) FROM facts WHERE user_id = 'ou_writer'").fetchone()[0]
        sessions = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    finally:
        conn.close()
    assert sessions == 4
    assert 0 < copied < done[0] and copied % BATCH == 0                 # a committed state, no torn transaction
    assert not list(target.parent.glob("*.part"))

    assert main(["backup", str(target)]) == 2                           # never overwritten silently
    one_line_error(capsys.readouterr().err)
    assert main(["backup", str(target), "--force"]) == 0
    capsys.readouterr()
    assert main(["backup", str(tmp_path / "backups")]) == 0             # a directory: timestamped file in it
    made = capsys.readouterr().out.split()[0]
    assert re.search(r"ethan-\d{8}-\d{6}\.db$", made) and Path(made).is_file()
    assert main(["backup", str(tmp_path / "new" / "dir") + "/"]) == 0       # trailing slash: a directory
    made = capsys.readouterr().out.split()[0]
    assert Path(made).parent == tmp_path / "new" / "dir" and Path(made).is_file()


def test_episodes_list_and_search(seeded, capsys):
    assert main(["episodes", "list", "--user", "ou_alice"]) == 0
    out = capsys.readouterr().out
    assert seeded["alice"] in out and "Alice 想学做乌龙茶" in out
    assert main(["episodes", "search", "--user", "ou_alice", "紫砂壶"]) == 0      # said in the turns only
    assert seeded["alice"] in capsys.readouterr().out
    assert main(["episodes", "search", "--user", "ou_bob", "紫砂壶"]) == 0        # another user's: nothing
    assert "no episode of ou_bob matches" in capsys.readouterr().out
