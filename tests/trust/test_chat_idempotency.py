"""``/chat`` Idempotency-Key across conversations (issue 32 Low) at the wire: the same key in
another conversation is 422 before and after a restart (it got conversation A's answer after
one). The real app and SDK against the fake model, an aiohttp client over loopback."""

from __future__ import annotations

import pytest

from tests.fakes.fake_anthropic import Text
from tests.harness import Harness

pytestmark = pytest.mark.app_backends
KEY = {"Idempotency-Key": "same-key-1"}


async def _chat(h, body):
    async with h.http.post(h.url + "/chat", json=body, headers=KEY) as r:
        return r.status, await r.json()


async def test_same_key_in_another_conversation_is_refused_before_and_after_a_restart(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("A 的回答"))
        a = {"user_id": "ou_alice", "text": "你好", "conversation": "a"}
        b = {"user_id": "ou_alice", "text": "你好", "conversation": "b"}
        status, first = await _chat(h, a)
        assert status == 200 and first["reply"] == "A 的回答"
        status, body = await _chat(h, b)
        assert status == 422 and "Idempotency-Key" in body["error"]
        await h.restart()
        status, body = await _chat(h, b)
        assert status == 422 and "Idempotency-Key" in body["error"], body
        status, again = await _chat(h, a)                     # A's own retry: still replayed
        assert status == 200 and again["reply"] == "A 的回答"
        assert len(h.model.chat_requests()) == 1
