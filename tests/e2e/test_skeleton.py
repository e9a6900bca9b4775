"""The walking skeleton at the wire: signed, encrypted webhook in; the reply API out."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.fakes.fake_anthropic import Delay, Text
from tests.fakes.lark_events import encrypt, make_text_event, sign, url_verification, webhook_request
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN, Harness


async def test_p2p_text_is_answered_with_the_reply_api(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("你好 Alice，我记住了。"))
        ev = await h.send_text("你好，我是 Alice")
        [reply] = await h.replies(1)
        assert reply.kind == "reply"
        assert reply.reply_to == ev["event"]["message"]["message_id"]
        assert reply.text == "你好 Alice，我记住了。"
        assert reply.uuid  # idempotent send
        [req] = h.model.chat_requests()
        assert h.model.last_user_text(req) == "你好，我是 Alice"
        assert req.model == "claude-sonnet-4-6"


async def test_url_verification_plain_and_encrypted(tmp_path):
    async with Harness(tmp_path) as h:
        ch = url_verification("ajls384kdjx98XX", VERIFICATION_TOKEN)
        # Encrypted (this app has an encrypt key) ...
        body = json.dumps({"encrypt": encrypt(json.dumps(ch), ENCRYPT_KEY)}).encode()
        async with h.http.post(h.url + "/lark/events", data=body,
                               headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200 and (await r.json()) == {"challenge": "ajls384kdjx98XX"}
    # ... and plain, for an app configured without one.
    async with Harness(tmp_path / "plain", lark_encrypt_key="") as h:
        async with h.http.post(h.url + "/lark/events", json=ch) as r:
            assert r.status == 200 and (await r.json()) == {"challenge": "ajls384kdjx98XX"}
        async with h.http.post(h.url + "/lark/events", json={**ch, "token": "forged"}) as r:
            assert r.status == 401


@pytest.mark.parametrize("attack", ["bad_signature", "old_timestamp", "wrong_token"])
async def test_forged_requests_get_401_and_touch_nothing(tmp_path, attack):
    async with Harness(tmp_path) as h:
        event = make_text_event("hi", chat_id="oc_p2p_alice")
        if attack == "wrong_token":
            headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token="forged")
        elif attack == "old_timestamp":
            headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN,
                                            timestamp=int(time.time()) - 6 * 60)
        else:
            headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
            headers["X-Lark-Signature"] = sign(headers["X-Lark-Request-Timestamp"], "other-nonce", ENCRYPT_KEY, body)
        async with h.http.post(h.url + "/lark/events", data=body, headers=headers) as r:
            assert r.status in (401, 403)
            assert (await r.text()) == ""
        await asyncio.sleep(0.2)
        assert h.model.requests == []
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 0
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages"))["n"] == 0


async def test_same_event_five_times_across_a_restart_one_reply(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("only once"))
        event = make_text_event("hello", chat_id="oc_p2p_alice")
        for _ in range(3):
            assert (await h.post(event))[0] == 200
        await h.replies(1)
        await h.idle()
        await h.restart()
        for _ in range(2):
            assert (await h.post(event))[0] == 200
        await h.idle()
        await asyncio.sleep(0.2)
        assert len(h.lark.messages()) == 1
        assert len(h.model.chat_requests()) == 1


async def test_slow_model_does_not_delay_the_acknowledgement(tmp_path):
    async with Harness(tmp_path, ethan_reply_deadline=30) as h:
        h.model.script(Delay(10, Text("finally")))
        t0 = time.monotonic()
        await h.send_text("a hard question")
        ack = time.monotonic() - t0
        assert ack < 1.0, ack
        assert h.lark.messages() == []        # not answered yet ...
        [reply] = await h.replies(1, timeout=20)
        assert reply.text == "finally"        # ... but later


async def test_conversations_run_in_parallel_and_each_keeps_its_order(tmp_path):
    async with Harness(tmp_path) as h:
        # The first message of conversation "slow" takes 3 s; everything else answers at once.
        def responder(req):
            text = h.model.last_user_text(req)
            if text == "slow-1":
                return Delay(3, Text("answer slow-1"))
            return Text(f"answer {text}")

        h.model.responder = responder
        await h.send_text("slow-1", chat_id="oc_slow", sender="ou_slow")
        await h.send_text("slow-2", chat_id="oc_slow", sender="ou_slow")
        for i in range(1, 4):
            await h.send_text(f"fast-{i}", chat_id="oc_fast", sender="ou_fast")
        # Not held up: all three fast answers are out before slow-1's (a wait for them, not a
        # fixed 1 s, which a loaded machine could overrun; the 3 s of slow-1 is the margin).
        for _ in range(600):                  # up to 30 s
            if sum(m.text.startswith("answer fast-") for m in h.lark.messages()) == 3:
                break
            await asyncio.sleep(0.05)
        texts = [m.text for m in h.lark.messages()]
        assert texts == ["answer fast-1", "answer fast-2", "answer fast-3"], texts
        await h.replies(5, timeout=10)
        texts = [m.text for m in h.lark.messages()]
        assert texts.index("answer slow-1") < texts.index("answer slow-2")
