"""Lark faults (issue item 8), end to end through the webhook: the Open API rejects the
token, rate-limits, loses a response, or is down for a while. Replies are retried with the
same uuid and delivered once — or given up with a ``reply.failed`` log line — never doubled.

tests/lark/test_outbound.py covers the sender alone (including an outage longer than the
90 s budget, which ends in ``reply.failed``); here the whole pipeline runs.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fakes.fake_anthropic import Text
from tests.fakes.fake_lark import chat_rate_limited, rate_limited, token_invalid
from tests.harness import Harness
from tests.reliability.support import deliveries_by_trigger, reply_uuids_by_trigger, wait_until

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


def _mid(ev: dict) -> str:
    return ev["event"]["message"]["message_id"]


def _reply_calls(h, ev) -> list:
    return [c for c in h.lark.calls_to(f"/messages/{_mid(ev)}/reply", "POST")]


async def _answered_once(h, ev, *, timeout: float = 10.0) -> None:
    await h.idle(timeout=timeout)
    await asyncio.sleep(0.2)
    assert deliveries_by_trigger(h.lark).get(_mid(ev)) == 1, h.lark.dump()
    uuids = {c.json["uuid"] for c in _reply_calls(h, ev)}
    assert len(uuids) == 1, uuids


async def test_expired_token_is_refreshed_once_for_everyone(tmp_path, logs):
    async with Harness(tmp_path) as h:
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        fetches = h.lark.token_fetches
        h.lark.expire_tokens()
        events = [await h.send_text(f"question {i}", chat_id=f"oc_p2p_{i}", sender=f"ou_{i}") for i in range(5)]
        for ev in events:
            await _answered_once(h, ev)
        assert h.lark.token_fetches == fetches + 1        # one refresh serves all five replies
    assert not logs.errors(), logs.errors()[:3]


async def test_token_rejected_on_the_reply_refreshes_and_retries_once(tmp_path, logs):
    async with Harness(tmp_path) as h:
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        fetches = h.lark.token_fetches
        h.lark.fail_next("/reply", **token_invalid())
        ev = await h.send_text("second question", **ALICE)
        await _answered_once(h, ev)
        calls = _reply_calls(h, ev)
        assert [c.code for c in calls] == [99991663, 0]
        assert h.lark.token_fetches == fetches + 1
    assert not logs.errors(), logs.errors()[:3]


async def test_token_rejected_twice_gives_up_with_a_log_line(tmp_path, logs):
    async with Harness(tmp_path) as h:
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        h.lark.fail_next("/reply", times=2, **token_invalid())
        ev = await h.send_text("second question", **ALICE)
        await h.idle()
        await asyncio.sleep(0.2)
        assert [c.code for c in _reply_calls(h, ev)] == [99991663, 99991663]   # no loop
        assert deliveries_by_trigger(h.lark).get(_mid(ev)) is None
        [failed] = logs.events("reply.failed")
        assert failed["code"] == 99991663 and failed["message_id"] == _mid(ev) and failed["chat_id"]
        assert not logs.events("dispatch.job_failed")          # one error line, not a traceback too
        row = await h.app.db.fetchone("SELECT status FROM inbox WHERE message_id = ?", (_mid(ev),))
        assert row["status"] == "pending"                      # a token problem may pass: replayed at start
        [undelivered] = logs.events("reply.undelivered")
        assert undelivered["inbox"] == "pending" and undelivered["retry_in_s"] == h.app.redelivery.redeliver_after_s
        # The bot is not stuck: the next message is answered.
        ev2 = await h.send_text("third question", **ALICE)
        await _answered_once(h, ev2)


async def test_undelivered_answer_is_tried_again_in_the_running_process(tmp_path, logs):
    """The answer was stored but Lark did not take it (token rejected twice): a while later the
    same process sends it again — the stored answer, not a second model call — once."""
    async with Harness(tmp_path) as h:
        h.app.redelivery.redeliver_after_s = 0.5
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        h.lark.fail_next("/reply", times=2, **token_invalid())
        model_calls = len(h.model.chat_requests())
        ev = await h.send_text("second question", **ALICE)
        await wait_until(lambda: deliveries_by_trigger(h.lark).get(_mid(ev)), 10, "the second try")
        await _answered_once(h, ev)
        codes = [c.code for c in _reply_calls(h, ev)]
        assert codes == [99991663, 99991663, 0], codes
        assert len({c.json["uuid"] for c in _reply_calls(h, ev)}) == 1        # the same uuid
        assert len(h.model.chat_requests()) == model_calls + 1                # replayed, not re-asked
        row = await h.app.db.fetchone("SELECT status, attempts FROM inbox WHERE message_id = ?", (_mid(ev),))
        assert (row["status"], row["attempts"]) == ("done", 2)


async def test_reply_lark_refuses_for_good_is_recorded_failed_not_replayed(tmp_path, logs):
    """Lark refuses the answer itself (230002: the bot is not in the group any more): the inbox
    says failed with the code, the restart does not try again, and the next message is answered."""
    async with Harness(tmp_path) as h:
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        h.lark.fail_next("/reply", times=1, status=400, code=230002, msg="Bot is not in the chat")
        ev = await h.send_text("second question", **ALICE)
        await h.idle()
        assert [c.code for c in _reply_calls(h, ev)] == [230002]                 # no retry
        row = await h.app.db.fetchone("SELECT status, note FROM inbox WHERE message_id = ?", (_mid(ev),))
        assert row["status"] == "failed" and "230002" in row["note"]
        assert not logs.events("dispatch.job_failed")
        await h.restart()
        await h.idle()
        assert [c.code for c in _reply_calls(h, ev)] == [230002]                 # not replayed
        ev2 = await h.send_text("third question", **ALICE)
        await _answered_once(h, ev2)


@pytest.mark.parametrize("fault", [chat_rate_limited(), rate_limited(1), rate_limited(1, status=400)],
                         ids=["230020", "99991400-http429", "99991400-http400"])
async def test_rate_limited_reply_backs_off_and_resends_the_same_uuid(tmp_path, logs, fault):
    async with Harness(tmp_path) as h:
        h.lark.fail_next("/reply", times=2, **fault)
        t0 = time.monotonic()
        ev = await h.send_text("hello", **ALICE)
        await _answered_once(h, ev)
        calls = _reply_calls(h, ev)
        assert [c.code for c in calls] == [fault["code"], fault["code"], 0]
        if "x-ogw-ratelimit-reset" in fault.get("headers", {}):
            assert calls[1].at - calls[0].at >= 0.9, "x-ogw-ratelimit-reset was not honoured"
        assert time.monotonic() - t0 < 10
    assert not logs.errors(), logs.errors()[:3]


async def test_lost_response_is_retried_without_doubling(tmp_path, logs):
    async with Harness(tmp_path) as h:
        h.lark.fail_next("/reply", status=500, deliver=True)        # delivered, answer lost
        ev = await h.send_text("hello", **ALICE)
        await _answered_once(h, ev)
        assert len(_reply_calls(h, ev)) == 2
    assert not logs.errors(), logs.errors()[:3]


async def test_reply_to_a_recalled_message_arrives_once_as_a_fresh_message(tmp_path, logs):
    from tests.fakes.lark_events import make_text_event

    async with Harness(tmp_path) as h:
        ev = make_text_event("hello, then I recall it", **ALICE)
        h.lark.register_inbound(ev)
        h.lark.recall_message(_mid(ev))
        assert (await h.post(ev))[0] == 200
        await h.idle()
        await asyncio.sleep(0.2)
        sent = h.lark.messages(chat_id="oc_p2p_alice")
        assert len(sent) == 1 and sent[0].kind == "create", sent
    assert not logs.errors(), logs.errors()[:3]


async def _outage(tmp_path, logs, *, seconds: float, mode: str, chats: int, per_chat: int) -> None:
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text(f"answer to {h.model.last_user_text(req).split(']')[-1].strip()}")
        await h.send_text("warm up", **ALICE)
        await h.replies(1)
        await h.idle()
        h.lark.set_down(seconds, mode=mode)
        t0 = time.monotonic()
        events = []
        for k in range(per_chat):
            for c in range(chats):
                events.append(await h.send_text(f"c{c} m{k}", chat_id=f"oc_p2p_{c}", sender=f"ou_{c}"))
        await asyncio.sleep(seconds / 2)
        assert len(h.lark.messages()) == 1, "nothing can be delivered during the outage"
        await h.idle(timeout=seconds + 60)
        assert time.monotonic() - t0 >= seconds * 0.9
        for ev in events:
            await _answered_once(h, ev)
        # Per chat, the answers arrived in the order of the questions.
        for c in range(chats):
            texts = [m.text for m in h.lark.messages() if m.text.startswith(f"answer to c{c} ")]
            assert texts == [f"answer to c{c} m{k}" for k in range(per_chat)], texts
        uuids = reply_uuids_by_trigger(h.lark)
        assert all(len(u) == 1 for u in uuids.values())
    assert not [e for e in logs.errors() if e.get("event") != "reply.failed"], logs.errors()[:3]
    assert not logs.events("reply.failed")


@pytest.mark.parametrize("mode", ["503", "reset"])
async def test_open_api_down_for_a_few_seconds_delivers_everything_once(tmp_path, logs, mode):
    await _outage(tmp_path, logs, seconds=3, mode=mode, chats=4, per_chat=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_open_api_down_for_thirty_seconds_delivers_everything_once(tmp_path, logs):
    await _outage(tmp_path, logs, seconds=30, mode="503", chats=10, per_chat=3)
