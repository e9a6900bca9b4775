"""Background consolidation end to end: real SessionStore / FactStore / ProfileStore /
EpisodeStore on SQLite, the real anthropic SDK against the fake Messages API."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading

import anthropic

from bot.llm.anthropic_model import AnthropicChatModel
from memory.models import route_consolidation_model
import pytest

from memory.working.consolidation_queue import ConsolidationQueue
from memory.working.consolidator import (
    COMPRESS_SYSTEM, EPISODE_SYSTEM, EXTRACT_TOOL, FOLD_SYSTEM, SUMMARY_TOOL, Consolidator,
)
from storage import database
from storage.sqlite import SqliteDatabase
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from memory.profile.modes import COMPANION, ModeStore
from memory.profile.store import ProfileStore
from memory.scope import Scope
from memory.sessions.store import SessionStore
from memory.working.view import ACK, LONG_TERM_TAG, SUMMARY_TAG, MemoryConfig, WorkingMemory
from tests.fakes.fake_anthropic import Delay, Error, FakeAnthropic, user_texts

MAIN = "claude-sonnet-4-6"


def kind_of(req: dict) -> str:
    system = req.get("system") or ""
    if system.startswith(COMPRESS_SYSTEM):
        return "compress"
    if system.startswith(FOLD_SYSTEM):
        return "fold"
    if system.startswith(EPISODE_SYSTEM):
        return "episode"
    return "extract"


def summary_answer(req: dict) -> dict:
    """Deterministic summaries that say what they covered."""
    text = user_texts(req)[0]
    k = kind_of(req)
    if k == "compress":
        body = text.split("Transcript:\n")[-1]
        said = re.findall(r"^\[[^\]]+\]: (q\d+)", body, re.M)
        return {"summary": "SUM(" + ",".join(said) + ")"}
    if k == "fold":
        return {"summary": "ROLL[" + ";".join(re.findall(r"SUM\([^)]*\)|ROLL\[[^\]]*\]", text)) + "]"}
    return {"summary": "EPISODE: " + " ".join(re.findall(r"q\d+|hiking|tea", text))}


def extract_answer(req: dict) -> dict:
    text = user_texts(req)[0]
    facts = []
    if "hiking" in text:
        facts.append({"content": "用户喜欢徒步", "category": "preference", "importance": 0.85})
    if "tea" in text:
        facts.append({"content": "The user drinks green tea every morning", "category": "preference",
                      "importance": 0.8})
    if "password" in text or "redacted" in text:
        facts.append({"content": "The user's server password: Zq8#kLp2", "category": "knowledge",
                      "importance": 0.9})
    psych = [{"entry": "feels anxious before exams"}] if "exam" in text else []
    return {"facts": facts, "profile_psych": psych}


class World:
    """All stores on one database file, a consolidator and a queue."""

    def __init__(self, path, fake: FakeAnthropic, *, config: MemoryConfig, model_override=None,
                 backoff=0.0, workers=2) -> None:
        self.path, self.fake, self.config = path, fake, config
        self.model_override, self.backoff, self.workers = model_override, backoff, workers

    async def open(self) -> "World":
        self.db = await database(self.path).open()     # a SQLite path or a PostgreSQL URL
        self.sessions = SessionStore(self.db)
        self.working = WorkingMemory(self.db, self.sessions, self.config)
        self.facts = FactStore(self.db)
        self.profile = ProfileStore(self.db)
        self.episodes = EpisodeStore(self.db)
        self.modes = ModeStore(self.db)
        self.client = anthropic.AsyncAnthropic(base_url=self.fake.base_url, api_key="test", max_retries=0)
        model = self.model_override or route_consolidation_model(MAIN)
        self.consolidator = Consolidator(AnthropicChatModel(self.client, model), timeout=10)
        self.queue = ConsolidationQueue(
            db=self.db, sessions=self.sessions, working=self.working, facts=self.facts, profile=self.profile,
            episodes=self.episodes, modes=self.modes, consolidator=self.consolidator, workers=self.workers,
            backoff_base=self.backoff, backoff_max=max(self.backoff, 0.001) * 8,
        )
        self.sessions.add_close_listener(self.queue.request_episode)
        await self.queue.start()
        return self

    async def close(self, *, drain: float = 5.0) -> bool:
        ok = await self.queue.drain(drain)
        await self.client.close()
        await self.db.close()
        return ok

    # one exchange the way the bot does it: store, build context, ask, store, request
    async def chat(self, text: str, *, user="ou_alice", name="Alice", chat_id="oc_p2p", chat_type="p2p",
                   wait=True) -> list[dict]:
        scope = Scope(user_id=user, chat_id=chat_id, chat_type=chat_type)
        res = await self.sessions.append_user(scope, text, sender_name=name)
        self.session_id = res.session.id
        ctx = await self.working.build_context(res.session.id, text, before_message_id=res.message.id,
                                               speaker_name=name)
        resp = await self.client.messages.create(model=MAIN, max_tokens=100, messages=ctx)
        await self.sessions.append_assistant(res.session.id, resp.content[0].text)
        self.queue.request(res.session.id)
        if wait:
            await self.queue.wait_idle(10)
        return ctx

    async def warm_rows(self, sid=None) -> list:
        return await self.db.fetchall(
            "SELECT first_msg_id, last_msg_id, turns, summary, folded FROM warm_summaries"
            " WHERE session_id = ? ORDER BY id", (sid or self.session_id,))


@pytest.fixture
def fake():
    with FakeAnthropic() as f:
        f.on_tool(SUMMARY_TOOL, summary_answer, keys={"summary"})
        f.on_tool(EXTRACT_TOOL, extract_answer, keys={"facts", "profile_psych"})
        yield f


def consolidation_calls(fake, kind: str) -> list:
    return [r for r in fake.requests if r.kind != "chat" and kind_of(r.json) == kind]


SMALL = MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=4)


# -- the 40-turn conversation ----------------------------------------------------------------

async def test_forty_turns_window_summaries_routing_and_facts(tmp_path, fake):
    w = await World(tmp_path / "e.db", fake, config=MemoryConfig()).open()
    try:
        hot = w.config.hot_size
        for i in range(1, 41):
            text = f"q{i}" + (" I love hiking on weekends" if i == 3 else "")
            ctx = await w.chat(text)
            # never more than the uncompressed turns (at most hot + batch - 1) plus the two
            # pairs, plus the current input
            assert len(ctx) <= 2 * (hot + w.config.compress_batch - 1) + 4 + 1, (i, ctx)
            roles = [m["role"] for m in ctx]
            assert roles[0] == "user" and roles[-1] == "user"
            assert all(a != b for a, b in zip(roles, roles[1:]))
            assert ctx[-1]["content"] == text and sum(m["content"] == text for m in ctx) == 1
        sid = w.session_id
        # 40 complete turns: compressions at 15, 20, 25, 30, 35, 40 turns
        compress = consolidation_calls(fake, "compress")
        assert len(compress) == 6
        assert {r.model for r in compress} == {"claude-haiku-4-5"}        # routed from claude-sonnet-4-6
        assert all(r.json["tool_choice"] == {"type": "tool", "name": "write_summary"} for r in compress)
        assert {r.model for r in fake.chat_requests()} == {MAIN}
        rows = await w.warm_rows()
        assert [r["summary"] for r in rows] == [f"SUM(q{a},q{a + 1},q{a + 2},q{a + 3},q{a + 4})"
                                                for a in range(1, 31, 5)]
        # extraction at 20 warm turns (after the 4th compression) folded 4 warm rows
        assert len(consolidation_calls(fake, "extract")) == 1
        assert [r["folded"] for r in rows] == [1, 1, 1, 1, 0, 0]
        view = await w.working.view(sid)
        assert view.long_term == "ROLL[SUM(q1,q2,q3,q4,q5);SUM(q6,q7,q8,q9,q10);" \
                                 "SUM(q11,q12,q13,q14,q15);SUM(q16,q17,q18,q19,q20)]"
        # the next request carries exactly: [长期记忆] pair, [对话摘要] pair (what the fake wrote), hot turns
        ctx = await w.working.build_context(sid, "next")
        assert ctx[0] == {"role": "user", "content": f"{LONG_TERM_TAG}\n{view.long_term}"}
        assert ctx[1] == {"role": "assistant", "content": ACK}
        assert ctx[2] == {"role": "user", "content": [
            {"type": "text", "text": f"{SUMMARY_TAG}\nSUM(q21,q22,q23,q24,q25)"},
            {"type": "text", "text": "SUM(q26,q27,q28,q29,q30)"}]}
        assert ctx[3] == {"role": "assistant", "content": ACK}
        assert [m["content"] for m in ctx[4::2]][:hot] == [f"q{i}" for i in range(31, 41)]
        assert len(ctx) == 4 + 2 * hot + 1
        # the chat request the fake saw at turn 40 had the [对话摘要] produced by the fake
        last_chat = fake.chat_requests()[-1].json["messages"]
        assert user_texts({"messages": last_chat})[1].startswith(SUMMARY_TAG + "\nSUM(")
        # the fact the extraction returned is stored for Alice and injected later
        scope = Scope(user_id="ou_alice", chat_id="oc_p2p", chat_type="p2p")
        top = await w.facts.top(scope)
        assert [f.content for f in top] == ["用户喜欢徒步"]
        assert top[0].source == "consolidator"
        assert top[0].confidence == 0.8          # ordinary extraction (importance 0.85): the 0.8 band
        extract_req = consolidation_calls(fake, "extract")[0]
        sent = user_texts(extract_req.json)[0]
        assert "hiking" in sent and "echo:" not in sent           # user lines only, never the bot's
    finally:
        await w.close()


async def test_consolidation_never_blocks_the_reply_path(tmp_path, fake):
    fake.clear()
    fake.on_tool(SUMMARY_TOOL, lambda r: Delay(0.5, _tool(SUMMARY_TOOL, summary_answer(r))))
    w = await World(tmp_path / "e.db", fake, config=SMALL).open()
    try:
        for i in range(1, 6):
            await w.chat(f"q{i}", wait=False)
        assert w.queue.depth == 1                 # the compression is running, slowly
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await w.chat("q6", wait=False)           # a reply meanwhile is not held up
        assert loop.time() - t0 < 0.5
        assert w.queue.depth == 1                # coalesced: one job, re-run after
        await w.queue.wait_idle(10)
        assert len(await w.warm_rows()) == 1
        # at most one job per session in flight: the second worker never raced the first
        assert len(consolidation_calls(fake, "compress")) == 1
        assert w.queue.stats().get("stale", 0) == 0
    finally:
        await w.close()


def _tool(name, data):
    from tests.fakes.fake_anthropic import ToolUse

    return ToolUse(name, data)


# -- restart in the middle ----------------------------------------------------------------------

async def test_restart_mid_job_neither_loses_nor_repeats(tmp_path, fake, caplog):
    path = tmp_path / "e.db"
    gate = threading.Event()

    def slow_summary(req):
        # Before the restart a compression is held, not merely slow: a fixed few seconds let the
        # first one finish (and commit) while a loaded machine was still sending the 11 turns.
        # The shutdown below cancels it; the fake's stop wakes it at teardown.
        if not gate.is_set():
            return Delay(600.0, _tool(SUMMARY_TOOL, summary_answer(req)))
        return _tool(SUMMARY_TOOL, summary_answer(req))

    fake.clear()
    fake.on_tool(SUMMARY_TOOL, slow_summary)
    fake.on_tool(EXTRACT_TOOL, extract_answer)
    w = await World(path, fake, config=SMALL).open()
    for i in range(1, 12):                       # 11 complete turns: 3 compressions due
        await w.chat(f"q{i}", wait=False)
    sid = w.session_id
    await fake.wait_for_requests_async(1, timeout=60, kind="tool")   # the first compression is in flight
    # at_level on the queue's own logger: the line is captured whatever level another part of
    # the process left on "ethan" (importing bench.common sets it to ERROR)
    with caplog.at_level(logging.WARNING, logger="ethan.consolidation"):
        assert await w.close(drain=0.2) is False     # shutdown deadline: in-flight work cancelled
    # the operator's line counts what was cut off, not what is left after cancelling it
    assert re.search(r"consolidation_drain_timeout left=[1-9]", caplog.text), caplog.text
    # nothing was committed for the cancelled job
    db = await SqliteDatabase(path).open()
    assert (await db.fetchone("SELECT COUNT(*) AS n FROM warm_summaries"))["n"] == 0
    await db.close()

    gate.set()
    before = len(consolidation_calls(fake, "compress"))
    w2 = await World(path, fake, config=SMALL).open()
    try:
        assert await w2.queue.recover() >= 1
        await w2.queue.wait_idle(60)
        rows = await w2.warm_rows(sid)
        # 11 turns, hot 3, batch 2: q1..q8 compressed in 4 batches; extraction after 4 warm turns
        assert [r["summary"] for r in rows] == ["SUM(q1,q2)", "SUM(q3,q4)", "SUM(q5,q6)", "SUM(q7,q8)"]
        assert len(consolidation_calls(fake, "compress")) - before == 4
        ranges = [(r["first_msg_id"], r["last_msg_id"]) for r in rows]
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))      # contiguous, no overlap
        # restart again: nothing left to do, no model call
        n = len(fake.requests)
        await w2.close()
        w3 = await World(path, fake, config=SMALL).open()
        await w3.queue.recover()
        await w3.queue.wait_idle(60)
        assert len(fake.requests) == n
        assert len(await w3.warm_rows(sid)) == 4
        await w3.close()
    finally:
        if w2.db.is_open:
            await w2.close()


async def test_recorded_extraction_survives_a_crash_before_applying(tmp_path, fake):
    """Extraction results are committed with extracted_upto, applied after: a crash in
    between loses nothing and asks the model nothing again."""
    path = tmp_path / "e.db"
    w = await World(path, fake, config=SMALL).open()
    await w.chat("q1 I love hiking")
    sid = w.session_id
    await w.queue.drain(1)                        # stop the queue, then "crash" after the commit
    state = await w.queue.store.state(sid)
    last = await w.working.last_message(sid)
    await w.queue.store.commit_extraction(sid, after_id=state.extracted_upto, upto_id=last.id, writes=[
        ("fact", "ou_alice", {"chat_id": "oc_p2p", "chat_type": "p2p", "thread_id": "", "message_id": "",
                              "content": "用户喜欢徒步", "category": "preference", "importance": 0.8,
                              "user_text": "I love hiking"})])
    await w.client.close()
    await w.db.close()
    calls = len(fake.requests)
    w2 = await World(path, fake, config=SMALL).open()
    try:
        await w2.queue.recover()
        await w2.queue.wait_idle(10)
        facts = await w2.facts.list("ou_alice")
        assert [f.content for f in facts] == ["用户喜欢徒步"]
        assert await w2.queue.store.pending_writes(sid) == []
        assert len(fake.requests) == calls
    finally:
        await w2.close()


# -- failures, backoff, nothing half-written -------------------------------------------------------

async def test_failing_model_call_backs_off_and_nothing_is_half_written(tmp_path, fake):
    fails = itertools.count()
    lock = threading.Lock()

    def flaky_extract(req):
        # Bob's extraction fails twice; Alice's always works (she is asked first)
        if "Bob line" in user_texts(req)[0]:
            with lock:
                if next(fails) < 2:
                    return Error.api_error(500)
        return _tool(EXTRACT_TOOL, extract_answer(req))

    fake.clear()
    fake.on_tool(SUMMARY_TOOL, summary_answer)
    fake.on_tool(EXTRACT_TOOL, flaky_extract)
    w = await World(tmp_path / "e.db", fake, config=SMALL, backoff=0.2).open()
    try:
        group = dict(chat_id="oc_group", chat_type="group")
        for i in range(1, 8):
            await w.chat(f"q{i} I love hiking", user="ou_alice", name="Alice", **group)
            await w.chat(f"q{i} Bob line about tea", user="ou_bob", name="Bob", **group)
        sid = w.session_id
        # the extraction failed once: nothing of it is written, a retry is scheduled
        state = await w.queue.store.state(sid)
        assert state.failures == 1 and state.next_attempt_at > 0 and "server" in state.last_error
        assert state.extracted_upto == 0
        assert await w.facts.list("ou_alice") == [] and await w.facts.list("ou_bob") == []
        assert all(r["folded"] == 0 for r in await w.warm_rows())
        assert w.queue.stats()["retry_scheduled"] == 1
        # a request during backoff does not call the model early
        n = len(fake.requests)
        w.queue.request(sid)
        await w.queue.wait_idle(5)
        assert len(fake.requests) == n
        # the timer retries: 0.2 s, then 0.4 s (exponential); the third attempt succeeds
        for _ in range(200):
            await asyncio.sleep(0.02)
            state = await w.queue.store.state(sid)
            if state.extracted_upto:
                break
        await w.queue.wait_idle(5)
        state = await w.queue.store.state(sid)
        assert state.failures == 0 and state.extracted_upto > 0
        bob_calls = [r for r in consolidation_calls(fake, "extract") if "Bob line" in user_texts(r.json)[0]]
        assert [r.answered_with for r in bob_calls[:3]] == ["Error", "Error", "ToolUse"]
        bob_calls = bob_calls[:3]
        gaps = [b.at - a.at for a, b in zip(bob_calls, bob_calls[1:])]
        assert gaps[0] >= 0.18 and gaps[1] >= 0.36, gaps
        # written exactly once, each fact for the user who said it
        assert [f.content for f in await w.facts.list("ou_alice")] == ["用户喜欢徒步"]
        assert [f.content for f in await w.facts.list("ou_bob")] == ["The user drinks green tea every morning"]
        assert all("Bob" not in user_texts(r.json)[0] for r in consolidation_calls(fake, "extract")
                   if "hiking" in user_texts(r.json)[0])
    finally:
        await w.close()


async def test_backoff_is_exponential_and_capped(db):
    from memory.working.consolidation_store import ConsolidationStore

    await db.execute("INSERT INTO sessions(id, conv_key, chat_id, chat_type, owner_id, created_at, updated_at)"
                     " VALUES ('s1', 'c', 'c', 'p2p', 'u', 0, 0)")
    w = ConsolidationStore(db)
    delays = [await w.record_failure("s1", "boom", base=1.0, cap_s=5.0, now=100.0) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    state = await w.state("s1")
    assert state.failures == 5 and state.next_attempt_at == 105.0


# -- structured outputs, credentials, modes ------------------------------------------------------------

async def test_structured_output_fallback_in_the_pipeline(tmp_path, fake):
    w = await World(tmp_path / "e.db", fake, config=SMALL, model_override="claude-opus-4-7").open()
    try:
        for i in range(1, 10):
            await w.chat(f"q{i} I love hiking")
        calls = [r for r in fake.requests if r.kind != "chat"]
        assert calls and all(r.kind == "structured" and r.model == "claude-opus-4-7" for r in calls)
        assert all("tool_choice" not in r.json and "temperature" not in r.json for r in calls)
        assert [r["summary"] for r in await w.warm_rows()][:2] == ["SUM(q1,q2)", "SUM(q3,q4)"]
        assert [f.content for f in await w.facts.list("ou_alice")] == ["用户喜欢徒步"]
    finally:
        await w.close()


async def test_credentials_are_not_stored(tmp_path, fake):
    w = await World(tmp_path / "e.db", fake, config=SMALL).open()
    try:
        await w.chat("my server password: Zq8#kLp2, and I love hiking")
        await w.chat("ok thanks")
        await w.sessions.close(w.session_id)      # final extraction + episode
        await w.queue.wait_idle(10)
        sent = [user_texts(r.json)[0] for r in consolidation_calls(fake, "extract")]
        assert sent and all("Zq8#kLp2" not in s for s in sent)      # redacted before it leaves
        facts = await w.facts.list("ou_alice")
        assert [f.content for f in facts] == ["用户喜欢徒步"]        # the secret fact was skipped
        state = await w.queue.store.state(w.session_id)
        assert state.failures == 0                                    # and the job did not fail
        rows = await w.db.fetchall("SELECT content FROM facts")
        assert all("Zq8" not in r["content"] for r in rows)
    finally:
        await w.close()


async def test_companion_mode_decides_profile_psych(tmp_path, fake):
    w = await World(tmp_path / "e.db", fake, config=SMALL).open()
    try:
        group = dict(chat_id="oc_g", chat_type="group")
        await w.modes.set("ou_alice", "oc_g", COMPANION)          # Bob stays in work mode
        for i in range(1, 4):
            await w.chat(f"q{i} exam tomorrow, I love hiking", user="ou_alice", name="Alice", **group)
            await w.chat(f"q{i} my exam too, tea", user="ou_bob", name="Bob", **group)
        await w.sessions.close(w.session_id)
        await w.queue.wait_idle(10)
        reqs = consolidation_calls(fake, "extract")
        alice = [r for r in reqs if "hiking" in user_texts(r.json)[0]]
        bob = [r for r in reqs if "tea" in user_texts(r.json)[0]]
        assert alice and bob
        assert all("心理与情绪" in r.json["system"] for r in alice)
        assert all("Leave profile_psych empty" in r.json["system"] for r in bob)
        assert "feels anxious before exams" in await w.profile.read_document("ou_alice")
        assert "anxious" not in await w.profile.read_document("ou_bob")
        # the fake returned psych for Bob too: it was dropped, not written
        assert [f.content for f in await w.facts.list("ou_bob")] == ["The user drinks green tea every morning"]
    finally:
        await w.close()


# -- episodes ---------------------------------------------------------------------------------

async def test_episode_per_user_once_with_final_extraction(tmp_path, fake):
    path = tmp_path / "e.db"
    w = await World(path, fake, config=MemoryConfig()).open()
    group = dict(chat_id="oc_g", chat_type="group")
    await w.chat("q1 I love hiking", user="ou_alice", name="Alice", **group)
    await w.chat("q2 green tea please", user="ou_bob", name="Bob", **group)
    await w.chat("q3 more hiking", user="ou_alice", name="Alice", **group)
    sid = w.session_id
    assert consolidation_calls(fake, "extract") == []            # short session: no warm extraction
    await w.sessions.close(sid)
    await w.queue.wait_idle(10)
    # facts of the short session were not lost
    assert [f.content for f in await w.facts.list("ou_alice")] == ["用户喜欢徒步"]
    assert [f.content for f in await w.facts.list("ou_bob")] == ["The user drinks green tea every morning"]
    # one episode for Alice (2 turns), none for Bob (1 turn)
    [ep] = await w.episodes.recent("ou_alice")
    assert ep.session_id == sid and ep.summary.startswith("EPISODE:") and "q3" in ep.summary
    assert ep.model == "claude-haiku-4-5" and ep.turn_count == 2 and ep.keywords
    assert await w.episodes.recent("ou_bob") == []
    assert len(consolidation_calls(fake, "episode")) == 1
    n = len(fake.requests)
    await w.close()
    # restart: the episode is recorded as done, nothing is redone
    w2 = await World(path, fake, config=MemoryConfig()).open()
    try:
        await w2.queue.recover()
        await w2.queue.wait_idle(10)
        assert len(fake.requests) == n
        assert len(await w2.episodes.recent("ou_alice")) == 1
    finally:
        await w2.close()


async def test_episode_interrupted_is_recovered(tmp_path, fake):
    path = tmp_path / "e.db"
    w = await World(path, fake, config=MemoryConfig()).open()
    await w.chat("q1 hiking")
    await w.chat("q2 more")
    sid = w.session_id
    await w.queue.drain(1)                      # the queue is gone before the session closes
    await w.sessions.close(sid)                 # request_episode is ignored: stopped
    await w.client.close()
    await w.db.close()
    w2 = await World(path, fake, config=MemoryConfig()).open()
    try:
        assert await w2.queue.recover() == 1
        await w2.queue.wait_idle(10)
        assert len(await w2.episodes.recent("ou_alice")) == 1
        assert (await w2.queue.store.state(sid)).episode_upto > 0
    finally:
        await w2.close()


async def test_stats_and_depth(tmp_path, fake):
    w = await World(tmp_path / "e.db", fake, config=SMALL).open()
    try:
        for i in range(1, 7):
            await w.chat(f"q{i}")
        s = w.queue.stats()
        assert s["depth"] == 0 and s["compressions"] == 1 and s["model"] == "claude-haiku-4-5"
        assert s["workers"] == 2
    finally:
        await w.close()


async def test_a_job_takes_at_most_max_steps_steps_and_the_next_one_goes_on(tmp_path, fake):
    """A job's steps, each from a fresh plan, stop at ``max_steps``; what is still due is the
    next job's (none lost, none done twice)."""
    w = await World(tmp_path / "e.db", fake, config=MemoryConfig(hot_size=3, compress_batch=2)).open()
    try:
        await w.queue.drain(1)                  # the jobs below run in this task, one at a time
        scope = Scope(user_id="ou_alice", chat_id="oc_p2p", chat_type="p2p")
        for i in range(1, 10):                  # 9 complete turns: three compressions due
            res = await w.sessions.append_user(scope, f"q{i}", sender_name="Alice")
            await w.sessions.append_assistant(res.session.id, f"a{i}")
        sid = res.session.id
        w.queue.max_steps = 2
        await w.queue.run_once(sid)
        assert len(consolidation_calls(fake, "compress")) == 2 and len(await w.warm_rows(sid)) == 2
        await w.queue.run_once(sid)
        assert len(consolidation_calls(fake, "compress")) == 3 and len(await w.warm_rows(sid)) == 3
        assert await w.queue.store.due(sid) is None and w.queue.stats()["jobs_done"] == 2
    finally:
        await w.close()
