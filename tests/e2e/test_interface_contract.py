"""One conversation, every interface (issue 28): the same two messages — "remember I like oolong",
then "what do I like?" — said over Lark (signed, encrypted webhooks to ``ethan serve`` behind
the fake Lark), the console playground (``POST /api/playground``), ``POST /chat`` and the
terminal chat (``ethan chat``, a second process on the same home), each by its own user. What
each user observes is the same: the same two answers, one fact in their memory, the fact in the
model's prompt for the second question (the answer depends on it), and the same stored
conversation. The interfaces differ only in how a message arrives and how its answer leaves.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest

from tests.fakes.fake_anthropic import FakeAnthropic, Text, ToolUse, default_responder
from tests.fakes.fake_lark import FakeLark
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import ServerProcess, post_event, sqlite_rows

REMEMBER = "记住我喜欢乌龙茶"
QUESTION = "我喜欢什么？"
FACT = "喜欢乌龙茶"
NOTED = "好的，记住了。"
KNOWN, UNKNOWN = "你喜欢乌龙茶。", "我还不知道。"

USERS = {"lark": "ou_alice", "console": "ou_bob", "chat": "ou_carol", "terminal": "ou_dave"}


def _texts(blocks) -> list[str]:
    if isinstance(blocks, str):
        return [blocks]
    return [b.get("text", "") for b in blocks or [] if isinstance(b, dict) and b.get("type") == "text"]


def responder(req: dict):
    """The model: writes the fact when asked to remember, answers the question from what its
    prompt says about the user (so the answer shows the memory), passes the rest (consolidation)
    to the fake's default."""
    if req.get("tool_choice", {}).get("type") in ("tool", "any") or req.get("output_config"):
        return default_responder(req)
    last = req["messages"][-1]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last.get("content") or []):
        return Text(NOTED)
    said = (_texts(last.get("content")) or [""])[-1]
    if REMEMBER in said:
        return ToolUse("memory_write", {"content": FACT, "category": "preference"})
    if QUESTION in said:
        system = "\n".join(_texts(req.get("system")))
        return Text(KNOWN if FACT in system else UNKNOWN)
    return default_responder(req)


@pytest.fixture
def fakes():
    lark = FakeLark(users={"ou_alice": "Alice"}).start()
    model = FakeAnthropic().start()
    model.responder = responder
    try:
        yield lark, model
    finally:
        model.stop()
        lark.stop()


async def _over_lark(srv, lark, http) -> list[str]:
    chat = "oc_p2p_contract"
    answers = []
    for i, text in enumerate((REMEMBER, QUESTION), start=1):
        ev = make_text_event(text, chat_id=chat, sender=USERS["lark"])
        lark.register_inbound(ev)
        assert await post_event(http, srv.url, ev) == 200
        [*_, last] = await lark.wait_for_messages_async(i, timeout=20, chat_id=chat)
        answers.append(last.text)
    return answers


async def _over_console(srv, http) -> list[str]:
    answers = []
    for text in (REMEMBER, QUESTION):
        async with http.post(srv.url + "/api/playground",
                             json={"user_id": USERS["console"], "chat": "p2p", "text": text}) as r:
            body = await r.json()
            assert r.status == 200 and body["status"] == "answered", body
            answers.append(body["text"])
    return answers


async def _over_chat(srv, http) -> list[str]:
    answers = []
    for text in (REMEMBER, QUESTION):
        async with http.post(srv.url + "/chat", json={"user_id": USERS["chat"], "text": text}) as r:
            body = await r.json()
            assert r.status == 200, body
            answers.append(body["reply"])
    return answers


def _over_terminal(srv) -> list[str]:
    env = {k: v for k, v in srv.env().items() if not k.startswith("LARK_")}
    env["ETHAN_PORT"] = "0"
    out = subprocess.run([sys.executable, "-m", "bot", "chat", "--user", USERS["terminal"]],
                         input=f"{REMEMBER}\n{QUESTION}\n/exit\n", capture_output=True, text=True,
                         encoding="utf-8", cwd=srv.home, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [line.split("ethan> ", 1)[1].strip() for line in out.stdout.splitlines() if "ethan> " in line]


async def test_the_same_conversation_over_every_interface(tmp_path, fakes):
    lark, model = fakes
    srv = ServerProcess(tmp_path / "home", lark, model)
    await srv.start_ready()
    try:
        answers, asked = {}, {}
        async with aiohttp.ClientSession() as http:
            for name, over in (("lark", lambda: _over_lark(srv, lark, http)),
                               ("console", lambda: _over_console(srv, http)),
                               ("chat", lambda: _over_chat(srv, http)),
                               ("terminal", lambda: asyncio.to_thread(_over_terminal, srv))):
                before = len(model.chat_requests())
                answers[name] = await over()
                asked[name] = model.chat_requests()[before:]
        # The same answers everywhere; the second shows the memory the first one wrote.
        assert answers == {name: [NOTED, KNOWN] for name in USERS}, answers
        for name, user in USERS.items():
            facts = [r["content"] for r in sqlite_rows(
                srv.db_path, "SELECT content FROM facts WHERE user_id = ?", (user,))]
            assert facts == [FACT], (name, facts)
            # The model's requests: remember (+ the tool round), then the question with the fact
            # in the system prompt — the same three requests for every interface.
            said = [(_texts(r.json["messages"][-1].get("content")) or [""])[-1] for r in asked[name]]
            assert [REMEMBER in s for s in said] == [True, False, False], (name, said)
            assert QUESTION in said[2] and FACT in model.last_system_text(asked[name][2]), name
            assert FACT not in model.last_system_text(asked[name][0]), name
            # One session holding the conversation, stored alike.
            stored = [(r["role"], r["content"]) for r in sqlite_rows(
                srv.db_path, "SELECT m.role, m.content FROM messages m JOIN sessions s ON s.id = m.session_id "
                             "WHERE s.owner_id = ? ORDER BY m.id", (user,))]
            assert stored == [("user", REMEMBER), ("assistant", NOTED), ("user", QUESTION), ("assistant", KNOWN)], \
                (name, stored)
    finally:
        srv.close()
