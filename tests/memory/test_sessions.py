"""Layer 1: sessions (lifecycle, lazy persistence, search, scoping, resume)."""

from __future__ import annotations

import dataclasses
import random
import re
import sqlite3
import time

import pytest

from tests.faults import fail_inserts, read_elsewhere, restore_inserts

from storage import Database, DatabaseError, database
from storage.sqlite import SqliteDatabase
from memory.scope import Scope
from memory.sessions.records import AmbiguousSession, SessionNotFound, StoredAnswer, make_title
from memory.sessions.search import EmptyQuery, fts_phrase, like_pattern, make_snippet
from memory.sessions.store import SessionStore

T0 = 1_781_000_000.0   # a fixed "now" (2026-06)
HOUR = 3600.0

A_P2P = Scope("ou_a", "oc_pa", "p2p")
B_P2P = Scope("ou_b", "oc_pb", "p2p")
A_GROUP = Scope("ou_a", "oc_g", "group")
B_GROUP = Scope("ou_b", "oc_g", "group")
C_GROUP = Scope("ou_c", "oc_g", "group")
ID_RE = re.compile(r"^s_\d{8}_\d{4}_[0-9a-f]{4}$")


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FixedBits(random.Random):
    """An RNG whose 16-bit draws come from a list (to force id tails)."""

    def __init__(self, values: list[int]) -> None:
        super().__init__(0)
        self.values = list(values)

    def getrandbits(self, k: int) -> int:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db, clock) -> SessionStore:
    return SessionStore(db, clock=clock)


async def count(db: Database, table: str) -> int:
    row = await db.fetchone(f"SELECT COUNT(*) AS n FROM {table}")
    return int(row["n"])


# -- creation, ids, titles, lazy persistence --------------------------------------------------
async def test_first_message_starts_a_session_with_spec_id_and_title(store, clock, db):
    res = await store.append_user(A_P2P, "  你好 Ethan，\n  帮我看看   这个 Python 脚本为什么运行得这么慢，谢谢你啦！再补充一句", sender_name="A")
    assert res.created and not res.duplicate and res.closed is None
    s = res.session
    assert ID_RE.match(s.id)
    assert s.id.startswith("s_" + time.strftime("%Y%m%d_%H%M", time.localtime(clock.now)) + "_")
    assert s.title == "你好 Ethan， 帮我看看 这个 Python 脚本为什么运行得这么慢，谢谢你"
    assert len(s.title) == 40
    assert (s.conv_key, s.chat_id, s.chat_type, s.owner_id) == ("oc_pa", "oc_pa", "p2p", "ou_a")
    assert (s.message_count, s.user_turns, s.closed_at) == (1, 1, None)
    assert res.message.role == "user" and res.message.sender_id == "ou_a" and res.message.sender_name == "A"
    assert (await store.active("oc_pa")).id == s.id


def test_make_title_is_first_40_characters_whitespace_collapsed():
    assert make_title("\n\n  hello \t\n world  ") == "hello world"
    assert make_title("x" * 100) == "x" * 40


async def test_nothing_is_written_before_the_first_user_message(store, db):
    assert await store.active("oc_pa") is None
    assert await store.close_active("oc_pa") is None        # /new on a fresh chat
    with pytest.raises(ValueError):
        await store.append_user(A_P2P, "   \n ")
    assert await count(db, "sessions") == 0
    assert await count(db, "conversations") == 0


async def test_session_and_first_message_are_one_transaction(store, db):
    # Fault injection at the database: the message insert fails after the session row.
    await fail_inserts(db, "messages")
    with pytest.raises(sqlite3.IntegrityError):
        await store.append_user(A_P2P, "hello")
    assert await count(db, "sessions") == 0
    assert await count(db, "conversations") == 0
    await restore_inserts(db, "messages")
    res = await store.append_user(A_P2P, "hello")
    assert res.created and await count(db, "sessions") == 1


async def test_user_message_is_committed_before_append_returns(store, db):
    res = await store.append_user(A_P2P, "remember this")
    rows = read_elsewhere(db, "SELECT content FROM messages WHERE id = ?", (res.message.id,))
    assert rows == [("remember this",)]


async def test_conversation_continues_in_its_active_session(store, clock):
    first = await store.append_user(A_P2P, "one")
    clock.advance(60)
    reply = await store.append_assistant(first.session.id, "ok", tool_calls=[{"name": "memory_write", "input": {"content": "x"}}])
    clock.advance(60)
    second = await store.append_user(A_P2P, "two")
    assert not second.created and second.session.id == first.session.id
    assert (second.session.message_count, second.session.user_turns) == (3, 2)
    assert second.session.updated_at == clock.now
    msgs = await store.messages(first.session.id)
    assert [m.content for m in msgs] == ["one", "ok", "two"]
    assert msgs[1].tool_calls == [{"name": "memory_write", "input": {"content": "x"}}] and msgs[1].role == "assistant"
    assert [m.content for m in await store.messages(first.session.id, after_id=reply.id)] == ["two"]
    assert [m.content for m in await store.messages(first.session.id, limit=2)] == ["one", "ok"]


async def test_append_assistant_to_unknown_session_raises(store):
    with pytest.raises(SessionNotFound):
        await store.append_assistant("s_20260101_0000_beef", "hi")


async def test_restart_keeps_the_conversation_going(db, clock, tmp_path):
    store = SessionStore(db, clock=clock)
    first = await store.append_user(A_P2P, "before the restart")
    await store.append_assistant(first.session.id, "noted")
    await db.close()

    reopened = await database(db.path).open()
    try:
        store2 = SessionStore(reopened, clock=clock)
        clock.advance(120)
        assert (await store2.active("oc_pa")).id == first.session.id
        res = await store2.append_user(A_P2P, "after the restart")
        assert res.session.id == first.session.id and not res.created
        assert [m.content for m in await store2.messages(res.session.id)] == [
            "before the restart", "noted", "after the restart"]
    finally:
        await reopened.close()


# -- ids and tails -------------------------------------------------------------------------
async def test_new_ids_avoid_tails_already_in_use(db, clock):
    store = SessionStore(db, clock=clock, rng=FixedBits([0xD139, 0xD139, 0xD139, 0xBEEF]))
    a = await store.append_user(A_P2P, "a")
    b = await store.append_user(B_P2P, "b")
    assert a.session.tail == "d139" and b.session.tail == "beef"


async def test_resolve_by_full_id_unique_tail_and_last(store, clock):
    s1 = (await store.append_user(A_P2P, "first")).session
    clock.advance(60)
    s2 = (await store.append_user(B_P2P, "second")).session
    assert (await store.resolve(s1.id)).id == s1.id
    assert (await store.resolve(s1.id.upper())).id == s1.id
    assert (await store.resolve(s1.tail)).id == s1.id
    assert (await store.resolve(" " + s2.id[-9:] + " ")).id == s2.id
    assert (await store.resolve("last")).id == s2.id
    assert (await store.resolve("last", user_id="ou_a")).id == s1.id


async def test_ambiguous_and_unknown_tails(db, clock):
    store = SessionStore(db, clock=clock, rng=FixedBits([0xD139]))   # every draw is d139
    s1 = (await store.append_user(A_P2P, "one")).session
    await store.close_active("oc_pa")
    clock.advance(60)                                                  # next minute: a new id
    s2 = (await store.append_user(A_P2P, "two")).session
    assert s1.tail == s2.tail == "d139" and s1.id != s2.id
    with pytest.raises(AmbiguousSession) as e:
        await store.resolve("d139", user_id="ou_a")
    assert {c.id for c in e.value.candidates} == {s1.id, s2.id}
    assert "d139" in str(e.value) and s1.id in str(e.value)
    # more characters of the id disambiguate
    assert (await store.resolve(s1.id[-9:], user_id="ou_a")).id == s1.id
    for unknown in ("ffff", "s_20990101_0000_ffff", "'; DROP TABLE sessions; --", "%", "_"):
        with pytest.raises(SessionNotFound):
            await store.resolve(unknown)
    with pytest.raises(SessionNotFound):
        await store.resolve("   ")


# -- idle timeout and closing -------------------------------------------------------------
async def test_idle_session_is_closed_and_a_new_one_started(store, clock):
    closed_seen = []
    store.add_close_listener(closed_seen.append)
    first = await store.append_user(A_P2P, "morning")
    clock.advance(6 * HOUR)                     # exactly the timeout: still the same session
    assert (await store.append_user(A_P2P, "still here")).session.id == first.session.id
    clock.advance(6 * HOUR + 1)
    res = await store.append_user(A_P2P, "next day")
    assert res.created and res.session.id != first.session.id
    assert res.closed is not None and res.closed.id == first.session.id
    assert res.closed.closed_at == clock.now and res.closed.user_turns == 2
    assert [s.id for s in closed_seen] == [first.session.id]
    assert (await store.active("oc_pa")).id == res.session.id


async def test_idle_timeout_is_configurable(db, clock):
    store = SessionStore(db, clock=clock, idle_timeout=60)
    first = await store.append_user(A_P2P, "hi")
    clock.advance(61)
    assert (await store.append_user(A_P2P, "hi again")).closed.id == first.session.id
    with pytest.raises(ValueError):
        SessionStore(db, idle_timeout=0)


async def test_close_idle_closes_only_idle_sessions(store, clock):
    seen = []

    async def on_close(info):
        seen.append(info.id)

    store.add_close_listener(on_close)
    old = (await store.append_user(A_P2P, "old")).session
    clock.advance(5 * HOUR)
    fresh = (await store.append_user(B_P2P, "fresh")).session
    clock.advance(1 * HOUR + 1)
    closed = await store.close_idle()
    assert [s.id for s in closed] == [old.id] and seen == [old.id]
    assert await store.active("oc_pa") is None
    assert (await store.active("oc_pb")).id == fresh.id
    assert await store.close_idle() == []


async def test_close_active_close_and_close_all(store, clock):
    seen = []
    store.add_close_listener(lambda info: seen.append(info.id))
    a = (await store.append_user(A_P2P, "a")).session
    b = (await store.append_user(B_P2P, "b")).session
    g = (await store.append_user(A_GROUP, "g")).session
    closed = await store.close_active("oc_pa")
    assert closed.id == a.id and closed.closed_at == clock.now
    assert await store.close_active("oc_pa") is None
    assert (await store.close(b.id)).id == b.id
    assert await store.close(b.id) is None            # already closed: no second notification
    with pytest.raises(SessionNotFound):
        await store.close("s_20990101_0000_0000")
    assert [s.id for s in await store.close_all()] == [g.id]
    assert seen == [a.id, b.id, g.id]
    # /new then a message: a new session starts
    res = await store.append_user(A_P2P, "again")
    assert res.created and res.session.id != a.id and res.closed is None


async def test_failing_listener_does_not_break_closing(store, caplog):
    calls = []

    def bad(info):
        raise RuntimeError("listener bug")

    store.add_close_listener(bad)
    store.add_close_listener(lambda info: calls.append(info.id))
    s = (await store.append_user(A_P2P, "x")).session
    assert (await store.close_active("oc_pa")).id == s.id
    assert calls == [s.id]
    assert "listener" in caplog.text
    store.remove_close_listener(bad)
    assert bad not in store._listeners


# -- duplicates ---------------------------------------------------------------------------------
async def test_redelivered_lark_message_is_stored_once(store, clock, db):
    first = await store.append_user(A_P2P, "hello", lark_message_id="om_1")
    clock.advance(7 * HOUR)                       # even past the idle timeout: nothing is written
    again = await store.append_user(A_P2P, "hello", lark_message_id="om_1")
    assert again.duplicate and not again.created and again.closed is None
    assert again.message.id == first.message.id and again.session.id == first.session.id
    assert await count(db, "messages") == 1
    assert (await store.active("oc_pa")).closed_at is None
    other = await store.append_user(A_P2P, "other", lark_message_id="om_2")
    assert not other.duplicate


# -- list, delete, cleanup ----------------------------------------------------------------------
async def test_list_newest_first_with_counts_and_filters(store, clock):
    a1 = (await store.append_user(A_P2P, "a1")).session
    await store.append_assistant(a1.id, "r")
    await store.close_active("oc_pa")
    clock.advance(10)
    g = (await store.append_user(A_GROUP, "g")).session
    clock.advance(10)
    b = (await store.append_user(B_P2P, "b")).session
    clock.advance(10)
    a2 = (await store.append_user(A_P2P, "a2")).session
    assert [s.id for s in await store.list()] == [a2.id, b.id, g.id, a1.id]
    assert [s.id for s in await store.list(limit=2)] == [a2.id, b.id]
    assert [s.id for s in await store.list(conv_key="oc_pa")] == [a2.id, a1.id]
    assert [s.id for s in await store.list(user_id="ou_a")] == [a2.id, g.id, a1.id]
    assert [s.id for s in await store.list(user_id="ou_b")] == [b.id]
    first = next(s for s in await store.list() if s.id == a1.id)
    assert (first.message_count, first.user_turns) == (2, 1) and first.closed_at is not None


async def test_delete_removes_session_messages_and_index(store, db):
    s = (await store.append_user(A_P2P, "secret project zebra")).session
    assert await store.delete(s.id) is True
    assert await store.delete(s.id) is False
    assert await store.get(s.id) is None
    assert await count(db, "messages") == 0
    assert await store.search("zebra") == []
    assert await store.active("oc_pa") is None
    assert (await store.append_user(A_P2P, "new")).created


async def test_cleanup_empty_removes_sessions_without_messages(store, db):
    kept = (await store.append_user(A_P2P, "kept")).session
    # An empty session, as an older version (or a crash in one) could have left behind.
    await db.execute(
        "INSERT INTO sessions(id, conv_key, chat_id, chat_type, owner_id, created_at, updated_at) "
        "VALUES ('s_20200101_0000_0e00', 'oc_x', 'oc_x', 'p2p', 'ou_x', 0, 0)"
    )
    assert await store.cleanup_empty() == 1
    assert await store.cleanup_empty() == 0
    assert [s.id for s in await store.list()] == [kept.id]


async def test_delete_user_messages_erases_a_user(store, db):
    ap = (await store.append_user(A_P2P, "my diary: feeling anxious")).session
    await store.append_assistant(ap.id, "sorry to hear you feel anxious")
    g = (await store.append_user(A_GROUP, "alice asks about payroll")).session
    await store.append_assistant(g.id, "payroll answer for alice")
    await store.append_user(B_GROUP, "bob asks about lunch")
    await store.append_assistant(g.id, "lunch answer for bob")
    await store.append_user(B_P2P, "bob private")

    result = await store.delete_user_messages("ou_a")
    assert (result.messages, result.sessions) == (4, 1)
    assert await store.get(ap.id) is None
    left = await store.messages(g.id)
    assert [m.content for m in left] == ["bob asks about lunch", "lunch answer for bob"]
    g2 = await store.get(g.id)
    assert g2.title == "bob asks about lunch" and g2.owner_id == "ou_b"
    assert (g2.message_count, g2.user_turns) == (2, 1)
    assert await store.search("payroll") == [] and await store.search("anxious") == []
    assert await store.list(user_id="ou_a") == []
    assert [s.id for s in await store.list(user_id="ou_b")] != []
    row = await db.fetchone("SELECT COUNT(*) AS n FROM conversation_members WHERE user_id = 'ou_a'")
    assert row["n"] == 0
    if db.dialect == "sqlite":   # the external-content FTS5 index agrees with the table
        assert (await db.fetchone("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")) is None


# -- resume -------------------------------------------------------------------------------------
async def test_resume_makes_an_old_session_active_again(store, clock):
    seen = []
    store.add_close_listener(lambda info: seen.append(info.id))
    old = (await store.append_user(A_P2P, "old topic")).session
    await store.close_active("oc_pa")
    clock.advance(3 * 24 * HOUR)
    cur = (await store.append_user(A_P2P, "new topic")).session
    seen.clear()
    resumed = await store.resume("oc_pa", old.tail, user_id="ou_a")
    assert resumed.id == old.id and resumed.closed_at is None and resumed.updated_at == clock.now
    assert seen == [cur.id]                                   # the active one was closed first
    assert (await store.get(cur.id)).closed_at == clock.now
    assert (await store.active("oc_pa")).id == old.id
    clock.advance(60)                                         # not idle-closed: resuming touched it
    res = await store.append_user(A_P2P, "back to the old topic")
    assert res.session.id == old.id and res.closed is None
    assert [m.content for m in await store.messages(old.id)] == ["old topic", "back to the old topic"]


async def test_resume_last_and_resuming_the_active_session(store, clock):
    s1 = (await store.append_user(A_P2P, "one")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    s2 = (await store.append_user(A_P2P, "two")).session
    seen = []
    store.add_close_listener(lambda info: seen.append(info.id))
    assert (await store.resume("oc_pa", s2.id, user_id="ou_a")).id == s2.id   # no-op
    assert seen == []
    assert (await store.resume("oc_pa", "last", user_id="ou_a")).id == s1.id  # the previous one
    assert seen == [s2.id]
    with pytest.raises(SessionNotFound):
        await store.resume("oc_pb", "last", user_id="ou_b")                   # nothing earlier


async def test_resume_never_crosses_private_and_group(store, clock):
    ap = (await store.append_user(A_P2P, "private")).session
    g = (await store.append_user(A_GROUP, "group talk")).session
    await store.append_user(B_GROUP, "bob too")
    bp = (await store.append_user(B_P2P, "bob private")).session
    with pytest.raises(SessionNotFound):
        await store.resume("oc_g", ap.id, user_id="ou_a")          # p2p session into a group
    with pytest.raises(SessionNotFound):
        await store.resume("oc_pa", g.id, user_id="ou_a")          # group session into a p2p chat
    with pytest.raises(SessionNotFound):
        await store.resume("oc_pa", bp.id, user_id="ou_a")         # someone else's p2p session
    with pytest.raises(SessionNotFound):
        await store.resume("oc_g", g.tail, user_id="ou_c")         # never took part in the group
    await store.close_active("oc_g")
    assert (await store.resume("oc_g", g.tail, user_id="ou_b")).id == g.id   # any participant
    await store.close_active("oc_g")
    assert (await store.resume("oc_g", "last", user_id=None)).id == g.id     # operator


async def test_resume_own_p2p_session_from_another_p2p_chat_moves_it(store):
    old = (await store.append_user(A_P2P, "in my old chat")).session
    new_chat = Scope("ou_a", "oc_pa2", "p2p")
    await store.append_user(new_chat, "hello from the new chat")
    resumed = await store.resume("oc_pa2", old.tail, user_id="ou_a")
    assert resumed.id == old.id and resumed.conv_key == "oc_pa2" and resumed.chat_id == "oc_pa2"
    assert await store.active("oc_pa") is None
    assert (await store.append_user(new_chat, "continue")).session.id == old.id


# -- search -------------------------------------------------------------------------------------
async def test_search_english_and_chinese(store, clock):
    en = (await store.append_user(A_P2P, "The deployment pipeline failed on the staging server")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    zh = (await store.append_user(A_P2P, "我们下周讨论一下记忆系统的数据库设计")).session
    await store.append_assistant(zh.id, "好的，数据库用 SQLite，索引用 FTS5。")
    hits = await store.search("staging server")
    assert [h.session.id for h in hits] == [en.id] and hits[0].method == "fts"
    assert "staging server" in hits[0].snippet
    assert [h.session.id for h in await store.search("DEPLOYMENT")] == [en.id]     # case folded
    hits = await store.search("数据库")
    assert [h.session.id for h in hits] == [zh.id] and hits[0].matches == 2       # one hit per session
    assert "数据库" in hits[0].snippet and hits[0].score > 0
    assert [h.session.id for h in await store.search("记忆系统")] == [zh.id]
    assert await store.search("not there at all") == []


async def test_search_two_character_chinese_and_english_phrases(store, clock):
    """Issue 16: the same answers on both backends for a two-character Chinese word (under the
    trigram index's three characters) and an English phrase (words in that order only)."""
    a = (await store.append_user(A_P2P, "我们讨论一下迁移方案，还有 staging server 的配置")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    b = (await store.append_user(A_P2P, "server 和 staging 分开部署，数据迁移放到周末")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    await store.append_user(A_P2P, "完全无关的话题")
    assert {h.session.id for h in await store.search("迁移")} == {a.id, b.id}
    assert [h.session.id for h in await store.search("数据")] == [b.id]
    assert [h.session.id for h in await store.search("staging server")] == [a.id]
    assert [h.session.id for h in await store.search("Staging Server")] == [a.id]
    assert [h.session.id for h in await store.search("server staging")] == []
    assert [h.session.id for h in await store.search("server 和")] == [b.id]


async def test_search_ranks_by_bm25_then_recency(store, clock):
    long_text = "今天的会议很长，" * 20 + "顺便提到了数据库迁移的事情，" + "然后继续讨论别的。" * 20
    loose = (await store.append_user(A_P2P, long_text)).session
    await store.close_active("oc_pa")
    clock.advance(60)
    dense = (await store.append_user(A_P2P, "数据库迁移")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    hits = await store.search("数据库迁移")
    assert [h.session.id for h in hits] == [dense.id, loose.id]
    assert hits[0].score > hits[1].score
    # equal scores: the more recently active session first
    twin1 = (await store.append_user(B_P2P, "identical words here")).session
    await store.close_active("oc_pb")
    clock.advance(60)
    twin2 = (await store.append_user(B_P2P, "identical words here")).session
    assert [h.session.id for h in await store.search("identical words")] == [twin2.id, twin1.id]
    assert [h.session.id for h in await store.search("identical words", limit=1)] == [twin2.id]


async def test_like_ranking_follows_bm25_too(store, clock):
    long_text = "今天的会议很长，" * 20 + "顺便提到了数据库迁移的事情，" + "然后继续讨论别的。" * 20
    loose = (await store.append_user(A_P2P, long_text)).session
    await store.close_active("oc_pa")
    clock.advance(60)
    dense = (await store.append_user(A_P2P, "数据库迁移")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    newest = (await store.append_user(A_P2P, "随便聊聊别的事情，" * 10)).session
    for q in ("数据库迁移", "迁移"):
        hits = await store.search(q, method="like")
        assert [h.session.id for h in hits] == [dense.id, loose.id], q
        assert hits[0].score > hits[1].score and hits[0].method == "like"
    twice = (await store.append_user(B_P2P, "数据库迁移 — 今天的会议很长，又说了数据库迁移")).session
    hits = await store.search("数据库迁移", method="like")
    assert twice.id in {h.session.id for h in hits} and newest.id not in {h.session.id for h in hits}
    for q in ("数据库迁移", "会议很长", "迁移的事"):   # term frequency and length weigh as in bm25
        like = [h.session.id for h in await store.search(q, method="like")]
        assert like == [h.session.id for h in await store.search(q, method="fts")], q


@pytest.mark.parametrize("backend", ["sqlite"])   # SQLite's choice of FTS5 vs scan
async def test_scoped_search_scans_small_scopes_and_uses_the_index_for_large_ones(store, clock):
    ids = []
    for i, text in enumerate(["kubernetes 集群升级计划", "升级 kubernetes 之前先备份数据库", "午饭吃什么"]):
        ids.append((await store.append_user(A_P2P, text)).session.id)
        await store.close_active("oc_pa")
        clock.advance(60)
    for i in range(9):
        await store.append_user(A_P2P, f"闲聊 {i}")            # A sees 12 messages
    # Elsewhere the term is common: scanning A's 12 messages beats ranking every match.
    for i in range(6):
        await store.append_user(Scope(f"ou_x{i}", f"oc_x{i}", "p2p"), f"kubernetes note {i}")
    small = await store.search("kubernetes", user_id="ou_a")
    assert small and all(h.method == "like" for h in small)
    rare = await store.search("升级计划", user_id="ou_a")                # rare term: the index
    assert [h.session.id for h in rare] == [ids[0]] and rare[0].method == "fts"
    store.scan_limit = 0                                                # a large scope: the index
    large = await store.search("kubernetes", user_id="ou_a")
    assert large and all(h.method == "fts" for h in large)
    assert [h.session.id for h in small] == [h.session.id for h in large] == [ids[0], ids[1]]
    assert [h.snippet for h in small] == [h.snippet for h in large]
    assert (await store.search("kubernetes"))[0].method == "fts"          # unscoped: the index


async def test_limit_keeps_the_best_ranked_not_the_newest(store, clock):
    best = (await store.append_user(A_P2P, "季度预算")).session            # oldest, densest
    await store.close_active("oc_pa")
    for i in range(5):
        clock.advance(60)
        await store.append_user(A_P2P, f"第{i}次会议，很长很长的讨论，" * 5 + "顺带提了季度预算。")
        await store.close_active("oc_pa")
    for method in ("fts", "like"):
        hits = await store.search("季度预算", limit=1, method=method)
        assert [h.session.id for h in hits] == [best.id], method


def test_snippet_is_centred_on_the_match():
    text = "开头的话。" * 40 + "这里提到了关键的季度预算数字。" + "后面的话。" * 40
    snip = make_snippet(text, "季度预算")
    assert "季度预算" in snip and snip.startswith("…") and snip.endswith("…")
    assert len(snip) <= 82
    assert make_snippet("short\n text", "text") == "short text"
    assert make_snippet("Hello World", "WORLD") == "Hello World"


@pytest.mark.parametrize(
    "query",
    ['"', '""', 'say "hi"', "*", "star*", "NEAR(a b)", "a NEAR b", "-x", "--", "(", "a)", "col:val",
     "content:foo", "AND", "OR NOT", "^start", "x + y", "{a b}", "'", "\\", "%", "_", "50%", "a_b", "\x00z"],
)
async def test_search_treats_special_characters_literally(store, query):
    await store.append_user(A_P2P, "plain text about nothing in particular")
    hits = await store.search(query)          # must not raise
    assert hits == []


async def test_search_finds_special_characters_literally(store, clock):
    s = (await store.append_user(A_P2P, 'he said "hi" then NEAR(a b) -x col:val *star 50% a_b')).session
    await store.close_active("oc_pa")
    other = (await store.append_user(A_P2P, "500 and axb and hi")).session
    for q in ['"hi"', "NEAR(a b)", "-x col", "col:val", "*star", "50%", "a_b"]:
        assert [h.session.id for h in await store.search(q)] == [s.id], q
    assert [h.session.id for h in await store.search("%")] == [s.id]      # LIKE path, escaped
    assert [h.session.id for h in await store.search("_")] == [s.id]
    assert {h.session.id for h in await store.search("hi")} == {s.id, other.id}
    assert fts_phrase('a"b') == '"a""b"' and like_pattern("5%_\\") == "%5\\%\\_\\\\%"


async def test_short_queries_use_like(store, clock):
    zh = (await store.append_user(A_P2P, "我想聊聊记忆")).session
    await store.close_active("oc_pa")
    clock.advance(60)
    en = (await store.append_user(A_P2P, "go to Ab testing")).session
    hits = await store.search("记忆")
    assert [h.session.id for h in hits] == [zh.id] and hits[0].method == "like"
    assert hits[0].snippet == "我想聊聊记忆" and hits[0].matches == 1
    assert [h.session.id for h in await store.search("ab")] == [en.id]     # ASCII case folded
    assert [h.session.id for h in await store.search("忆")] == [zh.id]
    # longer queries can be forced to LIKE, with the same results
    assert [h.session.id for h in await store.search("Ab testing", method="like")] == [en.id]
    with pytest.raises(ValueError):
        await store.search("ab", method="fts")
    with pytest.raises(ValueError):
        await store.search("abc", method="regex")


async def test_empty_query_is_a_clear_error(store):
    for q in ("", "   ", "\n\t"):
        with pytest.raises(EmptyQuery, match="empty query"):
            await store.search(q)
    assert issubclass(EmptyQuery, ValueError)


async def test_search_matches_titles(store):
    # The title folds the newline; only the title contains "alpha beta".
    s = (await store.append_user(A_P2P, "alpha\nbeta gamma")).session
    hits = await store.search("alpha beta")
    assert [h.session.id for h in hits] == [s.id]
    assert hits[0].message_id is None and hits[0].snippet == "alpha beta gamma"
    assert [h.session.id for h in await store.search("alpha beta", method="like")] == [s.id]


async def test_search_is_scoped_to_the_users_conversations(store):
    a = (await store.append_user(A_P2P, "alice private pineapple plans")).session
    await store.append_user(B_P2P, "bob private pineapple plans")
    g = (await store.append_user(A_GROUP, "group pineapple party")).session
    assert {h.session.id for h in await store.search("pineapple", user_id="ou_a")} == {a.id, g.id}
    b_hits = await store.search("pineapple", user_id="ou_b")
    assert all(h.session.conv_key == "oc_pb" for h in b_hits) and len(b_hits) == 1
    assert await store.search("alice", user_id="ou_b") == []           # A's p2p is invisible to B
    assert await store.search("pi", user_id="ou_b", conv_key="oc_g") == []   # B never spoke in the group
    await store.append_user(B_GROUP, "count me in")
    assert [h.session.id for h in await store.search("party", user_id="ou_b")] == [g.id]
    # in a group, conv_key keeps A's private sessions out of the group's results
    assert [h.session.id for h in await store.search("pineapple", user_id="ou_a", conv_key="oc_g")] == [g.id]
    with pytest.raises(SessionNotFound):
        await store.resolve(a.tail, user_id="ou_b")
    assert (await store.resolve("last", user_id="ou_b")).conv_key in {"oc_pb", "oc_g"}


async def test_search_groups_hits_per_session(store):
    s = (await store.append_user(A_P2P, "cache miss in prod")).session
    await store.append_assistant(s.id, "the cache miss comes from the key format")
    await store.append_user(A_P2P, "so fix the cache key")
    hits = await store.search("cache")
    assert len(hits) == 1 and hits[0].matches == 3
    like = await store.search("cache", method="like")
    assert len(like) == 1 and like[0].matches == 3


# -- values ------------------------------------------------------------------------------------
async def test_values_are_frozen(store):
    res = await store.append_user(A_P2P, "x")
    for value in (res, res.session, res.message):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)


async def test_locked_database_gives_a_clear_error_and_loses_nothing(tmp_path, clock):
    db = await SqliteDatabase(tmp_path / "locked.db", busy_timeout_ms=150).open()
    try:
        store = SessionStore(db, clock=clock)
        await store.append_user(A_P2P, "before")
        other = sqlite3.connect(db.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseError, match="busy"):
                await store.append_user(A_P2P, "while locked")
            assert [m.content for m in await store.messages((await store.active("oc_pa")).id)] == ["before"]
        finally:
            other.execute("ROLLBACK")
            other.close()
        res = await store.append_user(A_P2P, "after")
        assert [m.content for m in await store.messages(res.session.id)] == ["before", "after"]
    finally:
        await db.close()


async def test_append_user_returns_the_session_as_stored_in_three_round_trips(db):
    """What append_user returns is the session row after the message's triggers (counts,
    updated_at) — the same as reading it afterwards; on PostgreSQL the usual append (an open
    session) is four round trips: the active session with the duplicate check, the message, the
    conversation with the session's row, COMMIT (a new session adds its id check and insert)."""
    from tests.round_trips import counting_round_trips
    clock = Clock()
    store = SessionStore(db, clock=clock)
    first = await store.append_user(A_P2P, "hello", model="m1", lark_message_id="om_1")
    assert first.created and first.session == await store.get(first.session.id)
    assert (first.session.message_count, first.session.user_turns) == (1, 1)
    with counting_round_trips(db) as trips:
        await store.append_assistant(first.session.id, "hi")
    assert trips["n"] == 1, trips       # one statement, its own transaction
    clock.advance(5)
    with counting_round_trips(db) as trips:
        second = await store.append_user(A_P2P, "again", lark_message_id="om_2")
    assert not second.created and second.session == await store.get(first.session.id)
    assert (second.session.message_count, second.session.user_turns, second.session.updated_at) == (3, 2, T0 + 5)
    assert trips["n"] == (1 if db.dialect == "sqlite" else 3), trips
    again = await store.append_user(A_P2P, "again", lark_message_id="om_2")     # Lark's redelivery
    assert again.duplicate and again.message == second.message and again.session == await store.get(first.session.id)


# -- an answer and the messages it answered (issue 45 N14) -------------------------------------
async def _inbox_row(db: Database, message_id: str) -> None:
    await db.execute(
        "INSERT INTO inbox(event_id, message_id, chat_id, conv_key, create_time, received_at, payload, status,"
        " dedup_key) VALUES (?, ?, 'oc_pa', 'oc_pa', ?, ?, '{}', 'pending', ?)",
        (f"ev_{message_id}", message_id, T0, T0, f"msg:{message_id}"))


async def _inbox(db: Database) -> dict:
    return {r["message_id"]: (r["status"], r["note"] or "")
            for r in await db.fetchall("SELECT message_id, status, note FROM inbox")}


async def test_an_answer_finishes_the_messages_it_answered_together_and_a_redelivery_can_tell(store, db):
    """A turn read om_1 (stored, its own turn failed) with om_2: the answer replies to om_2 and
    finishes om_1's inbox row in the same transaction; ``answer_of`` then says om_1's answer
    is another message's (send nothing) and om_2's its own (replay)."""
    one = await store.append_user(A_P2P, "first", lark_message_id="om_1")
    await _inbox_row(db, "om_1")
    assert await store.answer_of(one.message) == StoredAnswer(None, False)
    two = await store.append_user(A_P2P, "second", lark_message_id="om_2")
    await _inbox_row(db, "om_2")
    assert await store.answer_of(one.message) == StoredAnswer(None, False, (two.message,))   # read them too

    # The session gone (erased mid-turn): nothing is written, the row stays pending.
    with pytest.raises(SessionNotFound):
        await store.append_assistant("s_gone", "lost", reply_to="om_2", together=("om_1",))
    assert await _inbox(db) == {"om_1": ("pending", ""), "om_2": ("pending", "")}

    answer = await store.append_assistant(one.session.id, "both", reply_to="om_2", together=("om_1",))
    assert answer.lark_message_id == "om_2"
    # om_2's own row is its reply's to finish (after delivery), not the answer's.
    assert await _inbox(db) == {"om_1": ("done", "answered with om_2"), "om_2": ("pending", "")}
    assert await store.answer_of(one.message) == StoredAnswer(answer, False)
    assert await store.answer_of(two.message) == StoredAnswer(answer, True)

    # An answer stored before answers recorded their message: its own when nothing came between.
    three = await store.append_user(A_P2P, "third", lark_message_id="om_3")
    old = await store.append_assistant(one.session.id, "old style")
    assert await store.answer_of(three.message) == StoredAnswer(old, True)
