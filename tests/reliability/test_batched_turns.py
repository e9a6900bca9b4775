"""Issue 45 N14: a message answered together with a later one is never answered again.

A turn reads the unanswered messages before its own merged with it (memory/working/view.py): a
message whose turn stored it and then failed (the database went away before its answer was
recorded) is answered by the next message's turn. Its redelivery then asked the model again
and sent a second answer — the same words answered twice. Now the answer records the message
it replied to, the inbox rows of the others it answered are finished in the transaction that
records it (memory/sessions/store.py ``append_assistant``), and a redelivery decides from the stored
answer (``answer_of``): replayed when it is its own, nothing sent when another message's
reply carried it.

The faults are real: the fake model's responder takes SQLite's write lock from a second
connection (as another process would) past the busy timeout, so the answer's write fails
with "database is locked" and the message is retried in-process (bot/delivery/redelivery.py).
The PostgreSQL stop under load: tests/replicas/test_batched_restart.py.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time

from storage.sqlite import BUSY_TIMEOUT_MS
from tests.fakes.fake_anthropic import Text, is_chat, last_user_text
from tests.harness import Harness
from tests.reliability.support import deliveries_by_trigger, reply_uuids_by_trigger, wait_until

TOKEN = re.compile(r"\btok-[a-z0-9]+\b")
HOLD_S = BUSY_TIMEOUT_MS / 1000 + 2      # past the busy timeout: a real "database is locked"


def answered_tokens(lark) -> dict[str, list[str]]:
    """Token -> the messages whose delivered reply answered it (the echo repeats every token of
    what the model read last: a message answered together with another shows in its reply)."""
    out: dict[str, list[str]] = {}
    for m in lark.messages():
        for t in TOKEN.findall(m.text):
            out.setdefault(t, []).append(m.reply_to)
    return out


class LockOnCalls:
    """The chat responder: echoes every token of the last user message; on the calls numbered
    in ``lock_on`` it first takes the database's write lock for ``HOLD_S`` (released by a
    thread), so the answer of that turn cannot be recorded."""

    def __init__(self, db_path, lock_on: set[int], wait_for: threading.Event) -> None:
        self.db_path, self.lock_on, self.wait_for = str(db_path), lock_on, wait_for
        self.calls = 0
        self.released = threading.Event()
        self.holding = 0

    def __call__(self, req: dict) -> Text:
        self.calls += 1
        if self.calls in self.lock_on:
            self.wait_for.wait(10)      # every message acknowledged before the lock is taken
            conn = sqlite3.connect(self.db_path, timeout=10, check_same_thread=False)
            conn.execute("BEGIN IMMEDIATE")
            self.holding += 1
            self.released.clear()

            def release() -> None:
                time.sleep(HOLD_S)
                conn.rollback()
                conn.close()
                self.holding -= 1
                self.released.set()

            threading.Thread(target=release, daemon=True).start()
        return Text("echo: " + " ".join(TOKEN.findall(last_user_text(req))))


async def _two_messages(h: Harness, lock_on: set[int]) -> tuple[LockOnCalls, list[str]]:
    h.app.redelivery.db_retry_delays_s = (4.0,)
    h.app.redelivery.db_notice_after_s = 600.0       # no "storage trouble" notice in between
    acked = threading.Event()
    responder = LockOnCalls(h.app.settings.db_path, lock_on, acked)
    h.model.on(is_chat, responder)
    first = await h.send_text("N14 first message tok-one")
    second = await h.send_text("N14 second message tok-two")
    acked.set()
    return responder, [first["event"]["message"]["message_id"], second["event"]["message"]["message_id"]]


async def _settled(h: Harness, logs, mids: list[str], timeout: float = 60) -> None:
    """Both rows finished, and the first one's retry has run (refused, or answered again)."""
    async def done() -> bool:
        rows = await h.app.db.fetchall("SELECT status FROM inbox WHERE message_id IN (?, ?)", tuple(mids))
        return len(rows) == 2 and all(r["status"] != "pending" for r in rows)
    end = time.monotonic() + timeout
    while not await done():
        assert time.monotonic() < end, "the inbox rows never finished"
        await h.idle(30)
    errors = lambda: [e for e in logs.events("handle.db_error") if e["message_id"] == mids[0]]   # noqa: E731
    await wait_until(lambda: errors() and (logs.events("event.not_claimed") or mids[0] in deliveries_by_trigger(h.lark)
                                            or logs.events("agent.answered_together")),
                     timeout, "the first message's retry")
    await h.idle(30)


async def test_a_message_answered_in_a_later_ones_turn_is_not_answered_again(tmp_path, logs):
    """The first message's answer cannot be recorded (the lock); the second's turn reads both
    and answers them; the first one's retry must not ask the model and answer it again."""
    async with Harness(tmp_path) as h:
        responder, (m1, m2) = await _two_messages(h, {1})
        await _settled(h, logs, [m1, m2])
        tokens = answered_tokens(h.lark)
        assert tokens == {"tok-one": [m2], "tok-two": [m2]}, tokens          # both, in one answer, once
        assert deliveries_by_trigger(h.lark) == {m2: 1}
        assert {m: len(u) for m, u in reply_uuids_by_trigger(h.lark).items()} == {m2: 1}
        assert responder.calls == 2, f"{responder.calls} model calls for two messages"
        rows = {r["message_id"]: (r["status"], r["note"]) for r in await h.app.db.fetchall(
            "SELECT message_id, status, note FROM inbox")}
        assert rows == {m1: ("done", f"answered with {m2}"), m2: ("done", "")}, rows
        roles = [r["role"] for r in await h.app.db.fetchall("SELECT role FROM messages ORDER BY id")]
        assert roles == ["user", "user", "assistant"], roles
        assert [e["inbox_id"] for e in logs.events("event.not_claimed")], "the retry was not refused"


async def test_a_retried_message_answers_the_later_ones_stored_after_it_once(tmp_path, logs):
    """Both turns store their message and fail to record an answer; the first message's retry
    comes first: its answer reads the second message too (it is stored after it), and the
    second one's retry sends nothing — before, it replayed the first one's answer as its own
    and its own words were never answered."""
    async with Harness(tmp_path) as h:
        responder, (m1, m2) = await _two_messages(h, {1, 2})
        await _settled(h, logs, [m1, m2], timeout=90)
        await wait_until(lambda: [e for e in logs.events("handle.db_error") if e["message_id"] == m2], 5,
                         "the second turn's failure")
        tokens = answered_tokens(h.lark)
        assert tokens == {"tok-one": [m1], "tok-two": [m1]}, tokens
        assert deliveries_by_trigger(h.lark) == {m1: 1}
        assert responder.calls == 3, f"{responder.calls} model calls"       # two lost answers, one kept
        rows = {r["message_id"]: (r["status"], r["note"]) for r in await h.app.db.fetchall(
            "SELECT message_id, status, note FROM inbox")}
        assert rows == {m1: ("done", ""), m2: ("done", f"answered with {m1}")}, rows


async def test_a_chat_api_retry_of_a_message_answered_together_hears_that_answer(tmp_path, logs):
    """``/chat`` (a caller that waits): the first request's answer cannot be recorded and it
    fails; the next message's answer covers both; the first one's retry (same Idempotency-Key)
    gets that stored answer — not a second model call, not an empty reply."""
    async with Harness(tmp_path) as h:
        ready = threading.Event()
        ready.set()
        responder = LockOnCalls(h.app.settings.db_path, {1}, ready)
        h.model.on(is_chat, responder)

        async def chat(text: str, key: str) -> tuple[int, dict]:
            body = {"user_id": "ou_alice", "text": text, "conversation": "n14"}
            async with h.http.post(h.url + "/chat", json=body, headers={"Idempotency-Key": key}) as r:
                return r.status, await r.json()

        status, body = await chat("N14 first message tok-one", "k-one")
        assert status >= 500, (status, body)                 # its answer could not be stored
        await wait_until(lambda: responder.released.is_set(), HOLD_S + 5, "the lock to be released")
        status, body = await chat("N14 second message tok-two", "k-two")
        assert (status, body["reply"]) == (200, "echo: tok-one tok-two"), body
        status, body = await chat("N14 first message tok-one", "k-one")
        assert (status, body["reply"]) == (200, "echo: tok-one tok-two"), body
        assert responder.calls == 2, f"{responder.calls} model calls"
        assert logs.events("agent.answered_together")


async def test_a_fault_between_the_batched_reply_and_its_row_replays_it_under_the_same_uuid(tmp_path, logs):
    """The window itself: the second turn answers both messages; its reply is held at Lark
    while the database is locked from outside, so the reply gets out and its row cannot be
    finished. Its retry replays the stored answer (the same uuid: Lark shows it once), and the
    first message — finished in the transaction that recorded the answer — is not answered
    again."""
    async with Harness(tmp_path) as h:
        h.app.redelivery.db_retry_delays_s = (4.0,)
        h.app.redelivery.db_notice_after_s = 600.0
        acked = threading.Event()
        base = LockOnCalls(h.app.settings.db_path, {1}, acked)
        second: list[str] = []
        locked_at_reply = threading.Event()

        def lock_once_the_reply_arrives() -> None:
            end = time.monotonic() + 30
            while not any(second[0] in c.path for c in h.lark.calls_to("/reply", "POST")):
                assert time.monotonic() < end
                time.sleep(0.002)
            conn = sqlite3.connect(str(h.app.settings.db_path), timeout=10, check_same_thread=False)
            conn.execute("BEGIN IMMEDIATE")     # the answer is recorded; the row's finish will wait
            locked_at_reply.set()
            time.sleep(HOLD_S)
            conn.rollback()
            conn.close()

        def responder(req: dict) -> Text:
            if base.calls == 1:                 # the second turn: the one answering both
                h.lark.stall_next("/reply", 1.5, method="POST")
                threading.Thread(target=lock_once_the_reply_arrives, daemon=True).start()
            return base(req)

        h.model.on(is_chat, responder)
        m1 = (await h.send_text("N14 first message tok-one"))["event"]["message"]["message_id"]
        m2 = (await h.send_text("N14 second message tok-two"))["event"]["message"]["message_id"]
        second.append(m2)
        acked.set()
        await wait_until(lambda: [e for e in logs.events("agent.replayed") if e["message_id"] == m2], 60,
                         "the batched answer replayed after its row could not be finished")
        await _settled(h, logs, [m1, m2])
        assert locked_at_reply.is_set()
        assert [e["message_id"] for e in logs.events("handle.db_error")] == [m1, m2]
        tokens = answered_tokens(h.lark)
        assert tokens == {"tok-one": [m2], "tok-two": [m2]}, tokens
        assert deliveries_by_trigger(h.lark) == {m2: 1}
        uuids = reply_uuids_by_trigger(h.lark)
        assert {m: len(u) for m, u in uuids.items()} == {m2: 1}, uuids                # replayed, same uuid
        assert len(h.lark.calls_to(f"/messages/{m2}/reply", "POST")) == 2             # sent, then replayed
        assert base.calls == 2, f"{base.calls} model calls"
        rows = {r["message_id"]: (r["status"], r["note"]) for r in await h.app.db.fetchall(
            "SELECT message_id, status, note FROM inbox")}
        assert rows == {m1: ("done", f"answered with {m2}"), m2: ("done", "")}, rows
