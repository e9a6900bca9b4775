"""Issue 45 N14: PostgreSQL stopped for ~3 s while one replica answers 20 chats x 3 messages.

A turn whose message was stored but whose answer could not be (the database went away during
the model call) is retried; meanwhile the chat's next message is answered, and its turn reads
the unanswered message too (merged with its own): one answer for both. Before the fix, the
retry asked the model again and answered that message a second time (the red team saw 2 and 4
doubles in 2 of 2 runs). Now every acknowledged message is answered exactly once: its words
are echoed in exactly one delivered reply (alone or together with later ones), no triggering
message gets two deliveries or two uuids.

The model echoes every token of the last user message it read, so a reply names the messages
it answered. Runs on the module's own cluster (stopped with ``-m fast``: every connection
terminated, as by an operator's restart); the replica reaches it through the delay proxy.
"""

from __future__ import annotations

import asyncio
import collections
import os
import string
import time

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Text, last_user_text, running_model
from tests.reliability.support import deliveries_by_trigger, reply_uuids_by_trigger, wait_for_progress
from tests.replicas.conftest import TOKEN
from tests.replicas.fleet import LarkSender, mid, pg_rows, text_event

CHATS = 20
PER_CHAT = 3
PACE_S = 0.02            # one event every 20 ms: the 60 events in 1.2 s, a chat's next one 0.4 s after its last
OUTAGE_S = 3.0
MODEL_LATENCY_S = 1.0    # the stop finds the first messages' turns in the model call, their next queued
EXPECTED_DURING_OUTAGE = ("webhook.store_failed",)


def echo_all(req: dict) -> Text:
    return Text("echo: " + " ".join(TOKEN.findall(last_user_text(req))))


@pytest.fixture
def model():
    with running_model(echo_all) as fake:
        yield fake


async def _round(fleet_on, own_cluster, lark, model, tag: str) -> dict:
    model.latency = MODEL_LATENCY_S
    url = own_cluster.new_database(template="template1")
    fleet = fleet_on(url)
    [srv] = await fleet.start(1)
    logged = len(srv.entries())         # rounds share the replica's home (and its log)
    events = [text_event(c, n, tag=tag) for n in range(PER_CHAT) for c in range(CHATS)]
    token_of = {mid(ev): ev["event"]["message"]["content"] for ev in events}
    token_of = {m: TOKEN.findall(c)[0] for m, c in token_of.items()}
    async with aiohttp.ClientSession() as http:
        lark_side = LarkSender(http, retry_after=0.25)
        stream = asyncio.gather(*(lark_side.deliver([srv.url], ev, after=i * PACE_S) for i, ev in enumerate(events)))
        while len(lark_side.acked) < len(events) // 3:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(own_cluster.stop_server, "fast")
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(own_cluster.start_server)
        await stream
    acked = set(lark_side.acked)
    assert acked == set(token_of)

    def replies() -> dict[str, list[str]]:
        """Token -> the triggering messages of the delivered replies that answered it."""
        out: dict[str, list[str]] = collections.defaultdict(list)
        for m in lark.messages():
            if m.reply_to in token_of:
                for t in TOKEN.findall(m.text):
                    out[t].append(m.reply_to)
        return out

    def pending() -> int:
        return pg_rows(url, "SELECT count(*) FROM inbox WHERE status = 'pending'")[0][0]

    await wait_for_progress(lambda: len(replies()), len(acked), stall=30,
                            what="every acknowledged message answered",
                            diagnose=lambda: f"{pending()} pending\n{fleet.tails()}")
    end = time.monotonic() + 60
    while pending():                       # retries still waiting: they must send nothing more
        assert time.monotonic() < end, f"{pending()} inbox rows still pending\n{fleet.tails()}"
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.5)               # a late second answer would be out by now

    answered = replies()
    twice = {t: ms for t, ms in answered.items() if len(ms) != 1}
    assert not twice, f"answered more than once: {list(twice.items())[:5]}\n{fleet.tails()}"
    assert set(answered) == set(token_of.values())
    delivered = {m: n for m, n in deliveries_by_trigger(lark).items() if m in token_of}
    assert all(n == 1 for n in delivered.values()), {m: n for m, n in delivered.items() if n != 1}
    uuids = {m: u for m, u in reply_uuids_by_trigger(lark).items() if m in token_of}
    assert all(len(u) == 1 for u in uuids.values()), {m: u for m, u in uuids.items() if len(u) != 1}
    code, _ = await srv.terminate()
    assert code == 0, srv.tail()
    assert not fleet.errors(ignore=EXPECTED_DURING_OUTAGE), fleet.errors(ignore=EXPECTED_DURING_OUTAGE)
    together = sum(1 for m in token_of if m not in delivered)
    stats = {"answered_together": together,
             "db_retries": sum(1 for e in srv.entries()[logged:] if e.get("event") == "handle.db_error"),
             "statuses": dict(collections.Counter(lark_side.statuses))}
    print(f"round {tag}: {stats}")
    return stats


async def test_postgresql_stopped_during_batched_turns_answers_each_message_once(fleet_on, own_cluster, lark,
                                                                                 model):
    await _round(fleet_on, own_cluster, lark, model, "ba")


# The issue asked for ten rounds; they were run (docs/reliability.md has the counts) and are
# one setting away: N14_ROUNDS=10. The suite runs 3 (~13 s each), keeping `make test` in its time.
ROUNDS = int(os.environ.get("N14_ROUNDS", "3"))


@pytest.mark.slow
@pytest.mark.timeout(60 + 60 * ROUNDS)
async def test_postgresql_stopped_during_batched_turns_ten_rounds(fleet_on, own_cluster, lark, model):
    rounds = [await _round(fleet_on, own_cluster, lark, model, f"b{string.ascii_lowercase[i]}")
              for i in range(1, ROUNDS + 1)]
    print("answered together per round:", [r["answered_together"] for r in rounds])
