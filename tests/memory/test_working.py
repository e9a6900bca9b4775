"""Layer 2 window: hot / pending / warm / rolling, the request context's exact shape,
and what consolidation is due (memory/working/consolidation_store.py) — read from the database, no
model involved."""

from __future__ import annotations

import pytest

from memory.working.consolidation_store import ConsolidationStore
from memory.scope import Scope
from memory.sessions.store import SessionStore
from memory.working.view import (
    ACK, LONG_TERM_TAG, SUMMARY_TAG, TRUNCATED, MemoryConfig, WorkingMemory,
)

SMALL = MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=4)


class Convo:
    """A conversation written through the real SessionStore."""

    def __init__(self, sessions: SessionStore, *, chat_id: str = "oc_p2p", chat_type: str = "p2p") -> None:
        self.sessions = sessions
        self.chat_id = chat_id
        self.chat_type = chat_type
        self.session_id = ""
        self.n = 0

    def scope(self, user_id: str = "ou_alice") -> Scope:
        self.n += 1
        return Scope(user_id=user_id, chat_id=self.chat_id, chat_type=self.chat_type,
                     message_id=f"om_{self.chat_id}_{self.n}")

    async def user(self, text: str, *, user_id: str = "ou_alice", name: str = "Alice"):
        scope = self.scope(user_id)
        res = await self.sessions.append_user(scope, text, sender_name=name, lark_message_id=scope.message_id)
        self.session_id = res.session.id
        return res.message

    async def bot(self, text: str):
        return await self.sessions.append_assistant(self.session_id, text)

    async def turns(self, n: int, *, start: int = 1, **who) -> None:
        for i in range(start, start + n):
            await self.user(f"q{i}", **who)
            await self.bot(f"a{i}")


@pytest.fixture
async def sessions(db):
    return SessionStore(db)


@pytest.fixture
async def convo(sessions):
    return Convo(sessions)


def wm(db, sessions, config=SMALL) -> WorkingMemory:
    return WorkingMemory(db, sessions, config)


def progress(db, config=SMALL) -> ConsolidationStore:
    """Consolidation's side of the same rows: what is due, the commits that move the window."""
    return ConsolidationStore(db, config)


def texts(messages):
    return [(m["role"], m["content"]) for m in messages]


async def test_every_uncompressed_turn_is_replayed_and_current_input_once(db, sessions, convo):
    w = wm(db, sessions)
    await convo.turns(4)                       # hot 3 + batch 2: compression not due yet
    current = await convo.user("now")          # the caller stores the message first
    ctx = await w.build_context(convo.session_id, "now", before_message_id=current.id)
    assert texts(ctx) == [
        ("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2"),
        ("user", "q3"), ("assistant", "a3"), ("user", "q4"), ("assistant", "a4"), ("user", "now"),
    ]
    # without the id, the trailing unanswered user message is taken as the current input
    assert await w.build_context(convo.session_id, "now") == ctx


async def test_empty_session_context_is_just_the_input(db, sessions, convo):
    w = wm(db, sessions)
    m = await convo.user("hello")
    blocks = [{"type": "text", "text": "hello"}, {"type": "image", "source": {"type": "url", "url": "x"}}]
    assert await w.build_context(convo.session_id, blocks, before_message_id=m.id) == [
        {"role": "user", "content": blocks}
    ]


async def test_pairs_come_first_in_spec_shape(db, sessions, convo):
    w = wm(db, sessions)
    c = progress(db)
    await convo.turns(7)
    work = await c.due(convo.session_id)
    assert work is not None and work.kind == "compress" and work.turns == 2
    turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
    assert [t.user_text for t in turns] == ["q1", "q2"]
    await c.commit_compression(work, "S1: q1 q2", model="m", first_msg_id=turns[0].first_id)
    await db.execute("UPDATE consolidation_state SET rolling_summary = 'LONG' WHERE session_id = ?",
                     (convo.session_id,))
    ctx = await w.build_context(convo.session_id, "now")
    assert ctx[:4] == [
        {"role": "user", "content": f"{LONG_TERM_TAG}\nLONG"},
        {"role": "assistant", "content": ACK},
        {"role": "user", "content": f"{SUMMARY_TAG}\nS1: q1 q2"},
        {"role": "assistant", "content": ACK},
    ]
    # no hole: q1, q2 are in the summary, every later turn is replayed verbatim
    assert texts(ctx[4:]) == [("user", "q3"), ("assistant", "a3"), ("user", "q4"), ("assistant", "a4"),
                              ("user", "q5"), ("assistant", "a5"), ("user", "q6"), ("assistant", "a6"),
                              ("user", "q7"), ("assistant", "a7"), ("user", "now")]
    view = await w.view(convo.session_id)
    assert view.long_term == "LONG" and view.summary == "S1: q1 q2"
    assert [t.user_text for t in view.hot_turns] == ["q3", "q4", "q5", "q6", "q7"] and view.pending == 0


async def test_no_hole_between_summaries_and_replayed_turns(db, sessions, convo):
    """Compressing whenever it is due, every request covers every earlier turn: the summaries
    up to compressed_upto, then all later turns verbatim — hot_size..hot_size+batch-1 of them."""
    cfg = SMALL
    w = wm(db, sessions, cfg)
    c = progress(db, cfg)
    for i in range(1, 30):
        current = await convo.user(f"q{i}")
        ctx = await w.build_context(convo.session_id, f"q{i}", before_message_id=current.id)
        summarised = [r["summary"] for r in await db.fetchall(
            "SELECT summary FROM warm_summaries WHERE session_id = ? ORDER BY id", (convo.session_id,))]
        covered = [q for s in summarised for q in s.split()]
        replayed = [m["content"] for m in ctx[:-1] if m["role"] == "user" and not str(m["content"]).startswith("[")]
        assert covered + replayed == [f"q{k}" for k in range(1, i)], (i, covered, replayed)
        if i > cfg.hot_size:
            assert cfg.hot_size <= len(replayed) <= cfg.hot_size + cfg.compress_batch - 1, (i, replayed)
        await convo.bot(f"a{i}")
        work = await c.due(convo.session_id)
        if work is not None and work.kind == "compress":
            turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
            await c.commit_compression(work, " ".join(t.user_text for t in turns), model="m",
                                       first_msg_id=turns[0].first_id)
        elif work is not None:
            await c.commit_extraction(convo.session_id, after_id=work.after_id, upto_id=work.upto_id,
                                      writes=[], reset_warm=True)


async def test_backlog_is_replayed_up_to_the_budget_then_trimmed_with_a_marker(db, sessions, convo, caplog):
    """Consolidation failing: nothing is compressed, turns pile up. They are replayed verbatim
    until the budget; then the oldest are left out — with a marker and a warning, never silently."""
    import logging

    from memory.working.view import TRIMMED

    cfg = MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=4, replay_budget=60)
    w = wm(db, sessions, cfg)
    for i in range(1, 9):
        await convo.user(f"question number {i} " + "x" * 40)
        await convo.bot(f"answer {i}")
    current = await convo.user("now")
    with caplog.at_level(logging.WARNING, logger="ethan.working"):
        ctx = await w.build_context(convo.session_id, "now", before_message_id=current.id)
    users = [m["content"] for m in ctx if m["role"] == "user"]
    # the whole normal window (hot 3 + batch 2 - 1 = 4 turns) always, whatever the budget;
    # the budget (60 estimated tokens, ~25 a turn) fits nothing older
    assert [u.split("\n\n")[-1].split(" x")[0] for u in users[:-1]] == [
        "question number 5", "question number 6", "question number 7", "question number 8"]
    assert users[0].startswith(TRIMMED.format(n=4) + "\n\n")
    [trimmed] = [r for r in caplog.records if r.getMessage() == "working.replay_trimmed"]
    assert trimmed.trimmed == 4 and trimmed.session_id == convo.session_id
    view = await w.view(convo.session_id)
    assert view.pending == 5 and len(view.hot_turns) == 4     # the view counts the stored "now" too
    # a budget that fits some of the backlog replays that much of it
    some = wm(db, sessions, MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=4, replay_budget=140))
    ctx = await some.build_context(convo.session_id, "now", before_message_id=current.id)
    users = [m["content"] for m in ctx if m["role"] == "user"]
    assert 4 < len(users) - 1 < 8 and users[0].startswith(TRIMMED.format(n=8 - (len(users) - 1)))
    # a larger budget replays the whole backlog verbatim, no marker
    roomy = wm(db, sessions, MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=4))
    ctx = await roomy.build_context(convo.session_id, "now", before_message_id=current.id)
    assert len([m for m in ctx if m["role"] == "user"]) == 9
    assert not any("earlier turns not shown" in str(m["content"]) for m in ctx)


async def test_warm_summaries_are_one_block_each_so_earlier_ones_keep_their_bytes(db, sessions, convo):
    w = wm(db, sessions)
    c = progress(db)
    await convo.turns(9)
    for _ in range(2):
        work = await c.due(convo.session_id)
        turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
        await c.commit_compression(work, f"S{turns[0].user_text}", model="m", first_msg_id=turns[0].first_id)
        if _ == 0:
            one = await w.build_context(convo.session_id, "now")
            assert one[0] == {"role": "user", "content": f"{SUMMARY_TAG}\nSq1"}
    two = await w.build_context(convo.session_id, "now")
    assert two[0] == {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_TAG}\nSq1"},
                                                  {"type": "text", "text": "Sq3"}]}
    assert two[1] == {"role": "assistant", "content": ACK}


async def test_group_turns_are_labelled_and_roles_alternate(db, sessions):
    w = wm(db, sessions)
    c = Convo(sessions, chat_id="oc_group", chat_type="group")
    await c.user("hi all", user_id="ou_alice", name="Alice")
    await c.bot("hello Alice")
    await c.user("me too", user_id="ou_bob", name="Bob")      # unanswered (failed reply)
    await c.user("and me", user_id="ou_carol", name="Carol")
    await c.bot("hello both")
    ctx = await w.build_context(c.session_id, "what now?", speaker_name="Dave")
    assert texts(ctx) == [
        ("user", "[Alice] hi all"), ("assistant", "hello Alice"),
        ("user", "[Bob] me too\n\n[Carol] and me"), ("assistant", "hello both"),
        ("user", "[Dave] what now?"),
    ]
    roles = [m["role"] for m in ctx]
    assert all(a != b for a, b in zip(roles, roles[1:]))


async def test_unanswered_message_before_current_merges_into_it(db, sessions, convo):
    w = wm(db, sessions)
    await convo.turns(1)
    await convo.user("lost question")          # the reply failed
    cur = await convo.user("again?")
    ctx = await w.build_context(convo.session_id, "again?", before_message_id=cur.id)
    assert texts(ctx) == [("user", "q1"), ("assistant", "a1"), ("user", "lost question\n\nagain?")]


async def test_replayed_messages_are_capped(db, sessions, convo):
    w = wm(db, sessions)
    await convo.user("x" * 10_000)
    await convo.bot("y" * 5_000)
    ctx = await w.build_context(convo.session_id, "next")
    assert len(ctx[0]["content"]) < 4100 and ctx[0]["content"].endswith(TRUNCATED)
    assert len(ctx[1]["content"]) < 4100 and ctx[1]["content"].endswith(TRUNCATED)


async def test_due_counts_only_complete_turns(db, sessions, convo):
    w = wm(db, sessions)                       # threshold: hot 3 + batch 2 = 5 complete turns
    c = progress(db)
    await convo.turns(4)
    assert await c.due(convo.session_id) is None
    await convo.user("q5")                     # being answered: not a complete turn yet
    assert await c.due(convo.session_id) is None
    await convo.bot("a5")
    work = await c.due(convo.session_id)
    assert work.kind == "compress" and work.after_id == 0
    turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
    assert [(t.user_text, t.assistant_text) for t in turns] == [("q1", "a1"), ("q2", "a2")]


async def test_commit_is_atomic_and_never_twice(db, sessions, convo):
    from memory.working.consolidation_state import StaleWork

    w = wm(db, sessions)
    c = progress(db)
    await convo.turns(5)
    work = await c.due(convo.session_id)
    await c.commit_compression(work, "S", model="m", first_msg_id=1)
    with pytest.raises(StaleWork):
        await c.commit_compression(work, "S again", model="m", first_msg_id=1)
    rows = await db.fetchall("SELECT summary FROM warm_summaries WHERE session_id = ?", (convo.session_id,))
    assert [r["summary"] for r in rows] == ["S"]
    state = await c.state(convo.session_id)
    assert state.compressed_upto == work.upto_id and state.warm_turns == 2
    assert await c.due(convo.session_id) is None


async def test_extraction_due_after_warm_capacity(db, sessions, convo):
    w = wm(db, sessions)
    c = progress(db)
    await convo.turns(7)
    for _ in range(2):
        work = await c.due(convo.session_id)
        assert work.kind == "compress"
        turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
        await c.commit_compression(work, f"S{turns[0].user_text}", model="m", first_msg_id=turns[0].first_id)
        await convo.turns(2, start=100 + _ * 2)
    work = await c.due(convo.session_id)
    assert work.kind == "extract" and work.turns == 4 and work.after_id == 0
    await c.commit_extraction(convo.session_id, after_id=0, upto_id=work.upto_id, writes=[],
                              rolling_summary="ROLL", fold_upto=work.upto_id)
    view = await w.view(convo.session_id)
    assert view.long_term == "ROLL" and view.summary == "" and view.warm_turns == 0


@pytest.mark.parametrize("backend", ["sqlite"])   # SQLite's query plan
async def test_hot_window_query_is_bounded(db, sessions, convo):
    """The hot window is read with an indexed, LIMITed query, not by loading the session."""
    w = wm(db, sessions)
    await convo.turns(3)
    from memory.working.view import HOT_IDS_SQL

    plan = await db.fetchall("EXPLAIN QUERY PLAN " + HOT_IDS_SQL, (convo.session_id, 0, 10**12, 3))
    detail = " ".join(r["detail"] for r in plan)
    assert "USING" in detail and "INDEX" in detail and "TEMP B-TREE" not in detail, detail


def test_config_defaults_match_spec():
    c = MemoryConfig()
    assert (c.hot_size, c.compress_batch, c.warm_capacity) == (10, 5, 20)
    with pytest.raises(Exception):
        c.hot_size = 3  # frozen
    with pytest.raises(ValueError):
        MemoryConfig(hot_size=0)


# -- context_and_view: the request's context and the panel's view from one read -------------

async def _compress_once(db, w, convo) -> None:
    c = progress(db)
    work = await c.due(convo.session_id)
    assert work is not None and work.kind == "compress"
    turns = await w.turns(convo.session_id, work.after_id, work.upto_id)
    await c.commit_compression(work, f"S{turns[0].user_text}", model="m", first_msg_id=turns[0].first_id)


async def _tool_result(db, session_id: str) -> None:
    await db.execute("INSERT INTO messages(session_id, role, content, tool_call_id, created_at)"
                     " VALUES (?, 'user', 'tool says', 'call_1', 0)", (session_id,))


SCENES = ["first message", "a few turns", "after a compression", "messages after the current one",
          "a tool result among them", "over the replay bound"]


@pytest.mark.parametrize("scene", SCENES)
async def test_context_and_view_equal_build_context_and_view(db, sessions, convo, scene, monkeypatch):
    """One read gives what the two reads give, whatever the session looks like: the replay
    before the current message, the view of everything (the current message too)."""
    import memory.working.view as working
    w = wm(db, sessions, MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=40, replay_budget=30))
    current_text = "now"
    if scene == "a few turns":
        await convo.turns(3)
    elif scene == "after a compression":
        await convo.turns(6)
        await _compress_once(db, w, convo)
    elif scene == "a tool result among them":
        await convo.turns(2)
        await _tool_result(db, convo.session_id)
        await convo.bot("after the tool")
    elif scene == "over the replay bound":
        monkeypatch.setattr(working, "MAX_REPLAY_TURNS", 3)     # the query's bound, made small
        await convo.turns(3)
    elif scene == "messages after the current one":
        await convo.turns(2)
    current = await convo.user(current_text)
    if scene == "messages after the current one":
        await convo.bot("an answer to the current one")
        await convo.user("and a queued one")
        await convo.user("and another")
    if scene == "over the replay bound":
        await convo.user("queued after it")      # the view's window starts a turn later
    sid = convo.session_id
    got_ctx, got_view = await w.context_and_view(sid, current_text, before_message_id=current.id,
                                                 speaker_name="Alice")
    assert got_ctx == await w.build_context(sid, current_text, before_message_id=current.id, speaker_name="Alice")
    assert got_view == await w.view(sid)
    assert any(t.user and t.user.id == current.id for t in got_view.hot_turns)


async def test_context_and_view_round_trips(db, sessions, convo):
    """The read every message makes: one hop on SQLite; on PostgreSQL the record with the
    session's row, the warm rows, the window's ids, its messages (the view's too), and COMMIT."""
    from tests.round_trips import counting_round_trips
    w = wm(db, sessions)
    await convo.turns(4)
    current = await convo.user("now")
    with counting_round_trips(db) as trips:
        await w.context_and_view(convo.session_id, "now", before_message_id=current.id)
    assert trips["n"] == (1 if db.dialect == "sqlite" else 5), trips


async def test_a_plan_with_nothing_due_is_three_round_trips(db, sessions, convo):
    """After every reply the queue asks for a plan: one statement says what is due, then the
    turns counted, then COMMIT (the pending writes are read only when there are some)."""
    from tests.round_trips import counting_round_trips
    await convo.turns(2)
    with counting_round_trips(db) as trips:
        plan = await progress(db).plan(convo.session_id)
    assert plan.work is None and plan.writes == [] and plan.meta.id == convo.session_id
    assert trips["n"] == (1 if db.dialect == "sqlite" else 3), trips


async def test_a_plan_leaves_the_turn_being_answered_out(db, sessions, convo):
    """A compression is due once ``hot_size + compress_batch`` turns are complete: the newest
    user message without its answer yet is not one (the plan reads the last id in its head)."""
    c = progress(db)
    await convo.turns(4)
    await convo.user("q5")                       # the bot is still answering it
    assert (await c.plan(convo.session_id)).work is None
    await convo.bot("a5")
    assert (await c.plan(convo.session_id)).work.kind == "compress"
