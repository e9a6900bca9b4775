"""``POST /chat`` (DESIGN.md §3) at the wire: the real app, an aiohttp client over loopback.

The offline model answers where the model's words do not matter; the fake Messages API
(tests/fakes) where the test counts the model's calls (an idempotent retry is answered once).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

import pytest

from bot.app import EthanApp
from tests.harness import Harness
from tests.web.conftest import offline_settings

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends

TOKEN = "chat-test-token"


async def chat(http: aiohttp.ClientSession, url: str, body, *, headers: dict | None = None,
               data: str | None = None) -> tuple[int, dict]:
    kw = {"data": data, "headers": {"Content-Type": "application/json", **(headers or {})}} \
        if data is not None else {"json": body, "headers": headers or {}}
    async with http.post(url + "/chat", **kw) as r:
        return r.status, await r.json()


async def test_chat_answers_through_the_real_pipeline(console):
    status, body = await chat(console.http, console.url, {"user_id": "ou_alice", "text": "你好"})
    assert status == 200, body
    assert set(body) == {"reply", "session_id", "path", "memory"}
    assert body["reply"].startswith("[offline]")
    assert body["path"] == "fast" and body["memory"]["path"] == "fast"
    # the session is a real one, readable in the console, and nothing went to Lark's inbox
    status, detail = await console.call("GET", f"/api/sessions/{body['session_id']}?user=ou_alice")
    assert status == 200 and [m["role"] for m in detail["messages"]] == ["user", "assistant"]
    assert detail["session"]["chat_id"] == "api_ou_alice"
    assert (await console.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 0


async def test_chat_memory_round_trip(console):
    status, first = await chat(console.http, console.url, {"user_id": "ou_alice", "text": "记住我喜欢喝咖啡"})
    assert status == 200 and first["reply"] == "[offline] 好的，我记住了：用户喜欢喝咖啡"
    status, second = await chat(console.http, console.url, {"user_id": "ou_alice", "text": "今天喝点什么好呢"})
    assert status == 200
    assert [f["content"] for f in second["memory"]["facts"]] == ["用户喜欢喝咖啡"]
    assert "我记得：用户喜欢喝咖啡" in second["reply"]
    assert second["session_id"] == first["session_id"]
    # another user does not see it; another conversation of the same user is another session
    status, bob = await chat(console.http, console.url, {"user_id": "ou_bob", "text": "今天喝点什么好呢"})
    assert status == 200 and bob["memory"]["facts"] == [] and "咖啡" not in bob["reply"]
    status, other = await chat(console.http, console.url,
                               {"user_id": "ou_alice", "text": "今天喝点什么好呢", "conversation": "work"})
    assert status == 200 and other["session_id"] != first["session_id"]
    assert [f["content"] for f in other["memory"]["facts"]] == ["用户喜欢喝咖啡"]


async def test_chat_commands_answer_without_the_model(console):
    await chat(console.http, console.url, {"user_id": "ou_alice", "text": "记住我喜欢喝咖啡"})
    status, body = await chat(console.http, console.url, {"user_id": "ou_alice", "text": "/memory"})
    assert status == 200 and "用户喜欢喝咖啡" in body["reply"]
    assert body["memory"] is None and body["path"] is None


async def test_chat_bad_requests_say_why(console):
    status, body = await chat(console.http, console.url, None, data="{not json")
    assert status == 400 and body["error"] == "the body is not valid JSON"
    status, body = await chat(console.http, console.url, None, data="[1, 2]")
    assert status == 400 and "JSON object" in body["error"]
    for bad, why in (({"text": "hi"}, "user id"), ({"user_id": "ou_a"}, "text"),
                     ({"user_id": "ou_a", "text": "  "}, "text"),
                     ({"user_id": "ou_a", "text": "hi", "conversation": "a b"}, "conversation"),
                     ({"user_id": "ou_a", "text": "hi", "chat": "x"}, "unknown field")):
        status, body = await chat(console.http, console.url, bad)
        assert status == 400 and why in body["error"], (bad, body)
    status, body = await chat(console.http, console.url, {"user_id": "ou_a", "text": "hi"},
                              headers={"Idempotency-Key": "x" * 129})
    assert status == 400 and "Idempotency-Key" in body["error"]


async def test_chat_streams_server_sent_events(console):
    async with console.http.post(console.url + "/chat", json={"user_id": "ou_alice", "text": "记住我喜欢喝咖啡"},
                                 headers={"Accept": "text/event-stream"}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [(block.split("\n")[0].removeprefix("event: "), json.loads(block.split("\n")[1].removeprefix("data: ")))
              for block in raw.strip().split("\n\n")]
    assert events[-1][0] == "done"
    done = events[-1][1]
    assert done["reply"] == "[offline] 好的，我记住了：用户喜欢喝咖啡" and done["session_id"]
    assert all(name == "delta" for name, _ in events[:-1])


async def test_chat_needs_the_token_once_one_is_set(tmp_path):
    app = EthanApp(offline_settings(tmp_path, ethan_console_token=TOKEN))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            body = {"user_id": "ou_alice", "text": "你好"}
            # once a token is set, even on loopback (DESIGN.md §3) …
            status, refused = await chat(http, app.base_url, body)
            assert status == 401 and refused["error"] == "unauthorized"
            # … and under another host name (a proxy in front)
            status, refused = await chat(http, app.base_url, body, headers={"Host": "ethan.example.com"})
            assert status == 401 and refused["error"] == "unauthorized"
            status, refused = await chat(http, app.base_url, body,
                                         headers={"Host": "ethan.example.com", "Authorization": "Bearer wrong"})
            assert status == 401
            status, answered = await chat(http, app.base_url, body,
                                          headers={"Host": "ethan.example.com", "Authorization": f"Bearer {TOKEN}"})
            assert status == 200 and answered["reply"]
    finally:
        await app.stop()


async def test_a_retried_chat_is_answered_once(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.latency = 0.3          # the retry arrives while the first is being answered
        body = {"user_id": "ou_carol", "text": "what should I cook tonight?"}
        key = {"Idempotency-Key": "retry-1"}
        (s1, first), (s2, during) = await asyncio.gather(chat(h.http, h.url, body, headers=key),
                                                         chat(h.http, h.url, body, headers=key))
        s3, after = await chat(h.http, h.url, body, headers=key)
        assert (s1, s2, s3) == (200, 200, 200)
        assert first == during == after
        assert len(h.model.chat_requests()) == 1
        session = await h.app.memory.sessions.get(first["session_id"])
        assert session.user_turns == 1                      # stored once, too
        # the same key for another question is refused, not answered with the old answer
        status, refused = await chat(h.http, h.url, {**body, "text": "something else"}, headers=key)
        assert status == 422 and "Idempotency-Key" in refused["error"]
        # without a key, the same text is a new message
        status, again = await chat(h.http, h.url, body)
        assert status == 200 and len(h.model.chat_requests()) == 2

        # after a restart the answer is replayed from the session, not asked again
        await h.restart()
        status, replayed = await chat(h.http, h.url, body, headers=key)
        assert status == 200 and replayed["reply"] == first["reply"]
        assert replayed["session_id"] == first["session_id"]
        assert len(h.model.chat_requests()) == 2
