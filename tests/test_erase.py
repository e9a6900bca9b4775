"""Erasing one user (memory/governance/erase.py): one transaction, every table, nobody else touched.

Data is written through the real stores; the check afterwards is an independent scan of
every column of every table in the database for the user's ids.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import BACKENDS
from tests.faults import fail_inserts, restore_inserts


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Erasure is part of the store contract: on both backends."""
    return request.param

from bot.delivery.inbox_store import Inbox
from memory.governance.audit import AuditLog
from memory.working.consolidation_state import Work
from memory.working.consolidation_store import ConsolidationStore
from memory.episodes.store import EpisodeStore
from memory.governance.erase import ERASED_PAYLOAD, erase_user, find_user
from memory.facts.store import FactStore
from memory.profile.modes import COMPANION, ModeStore
from memory.procedures import ProcedureStore
from memory.profile.store import ProfileStore
from memory.scope import Scope
from memory.sessions.store import SessionStore
from tests.fakes.lark_events import make_text_event

ALICE, BOB = "ou_alice", "ou_bob"
ALICE_IDS = ("ou_alice", "on_alice")       # open_id and union_id as Lark sends them
P2P_A, P2P_B, GROUP = "oc_p2p_alice", "oc_p2p_bob", "oc_group"


async def scan(db, needles) -> dict[str, int]:
    """Rows of every ordinary table (FTS index internals aside) with a needle in any column."""
    found: dict[str, int] = {}
    for name, columns in (await db.table_columns()).items():
        cols = [c for c, _ in columns]
        for needle in needles:
            where = " OR ".join(f'instr(CAST("{c}" AS TEXT), ?) > 0' for c in cols)
            row = await db.fetchone(f'SELECT COUNT(*) AS n FROM "{name}" WHERE {where}', [needle] * len(cols))
            if row["n"]:
                found[f"{name}:{needle}"] = row["n"]
    return found


class World:
    """Alice and Bob, each with a p2p chat, both in one group; everything written for real."""

    def __init__(self, db) -> None:
        self.db = db
        self.sessions = SessionStore(db)
        self.progress = ConsolidationStore(db)
        self.facts = FactStore(db)
        self.procedures = ProcedureStore(db)
        self.profile = ProfileStore(db)
        self.episodes = EpisodeStore(db)
        self.modes = ModeStore(db)
        self.inbox = Inbox(db)
        self.n = 0

    def scope(self, user: str, chat: str, *, admin: bool = False) -> Scope:
        self.n += 1
        return Scope(user_id=user, chat_id=chat, chat_type="p2p" if chat.startswith("oc_p2p") else "group",
                     message_id=f"om_{self.n}", is_admin=admin)

    async def say(self, user: str, chat: str, text: str, reply: str | None = None, *, mentions=None):
        scope = self.scope(user, chat)
        event = make_text_event(text, chat_id=chat, chat_type=scope.chat_type, sender=user,
                                message_id=scope.message_id, mentions=mentions)
        await self.inbox.accept(event_id=event["header"]["event_id"], message_id=scope.message_id,
                                chat_id=chat, conv_key=chat, create_time=time.time(),
                                payload=json.dumps(event, ensure_ascii=False))
        res = await self.sessions.append_user(scope, text, sender_name=user[3:].title(),
                                              lark_message_id=scope.message_id)
        if reply is not None:
            await self.sessions.append_assistant(res.session.id, reply)
            await self.db.execute(
                "INSERT INTO outbox(uuid, chat_id, reply_to, kind, status, created_at) VALUES (?,?,?,?,?,?)",
                (f"r-{scope.message_id}", chat, scope.message_id, "text", "sent", time.time()))
        return res.session

    async def populate(self) -> dict[str, str]:
        sid = {}
        # p2p: Alice, two turns; Bob, two turns
        sid["a"] = (await self.say(ALICE, P2P_A, "我叫爱丽丝，最近在学吉他", "好的")).id
        await self.say(ALICE, P2P_A, "secret hobby: zebra-painting", "nice")
        sid["b"] = (await self.say(BOB, P2P_B, "I like tea", "ok")).id
        await self.say(BOB, P2P_B, "and biscuits", "ok")
        # group: Alice starts, Bob answers, Alice again (Bob mentions Alice)
        sid["g"] = (await self.say(ALICE, GROUP, "alice-group-words here", "reply to alice")).id
        await self.say(BOB, GROUP, "bob-group-words @Alice", "reply to bob", mentions=[ALICE])
        await self.say(ALICE, GROUP, "alice again", "second reply to alice")
        # a session of Alice that Bob continued after she started it (owner = Alice)
        sid["g2"] = (await self.say(ALICE, "oc_group2", "alice opens topic", "r1")).id
        await self.say(BOB, "oc_group2", "bob continues", "r2")
        # warm summary over the group's first turns; consolidation writes for both
        first = (await self.sessions.messages(sid["g"], limit=1))[0].id
        msgs = await self.sessions.messages(sid["g"])
        await self.progress.commit_compression(
            Work(sid["g"], "compress", 0, msgs[3].id, 2), "alice-summary of group", model="m", first_msg_id=first)
        await self.progress.commit_extraction(
            sid["g"], after_id=0, upto_id=msgs[3].id,
            writes=[("fact", ALICE, {"content": "alice-pending"}), ("fact", BOB, {"content": "bob-pending"})],
            rolling_summary="alice-rolling", fold_upto=msgs[3].id, reset_warm=False)
        # memory layers
        for user, chat in ((ALICE, P2P_A), (ALICE, GROUP), (BOB, P2P_B), (BOB, GROUP)):
            await self.facts.add(self.scope(user, chat), f"{user} likes {chat} music", "preference",
                                 source="agent_proactive")
            await self.profile.update(self.scope(user, chat), "goals", f"{user} goal in {chat}")
            await self.procedures.add(self.scope(user, chat), f"{user} rule for {chat}")
            await self.modes.set(user, chat, COMPANION)
        await self.procedures.add(self.scope(ALICE, GROUP, admin=True), "chat rule by alice", chat_scope=True)
        for user, s in ((ALICE, sid["a"]), (ALICE, sid["g"]), (BOB, sid["b"]), (BOB, sid["g"])):
            await self.episodes.write(session_id=s, user_id=user, chat_id="c", chat_type="p2p",
                                      summary=f"{user} episode about guitar lessons", turn_count=2)
        await AuditLog(self.db).record(BOB, "reset_user", target=ALICE, chat_id=GROUP, detail="erase")
        return sid


@pytest.fixture
async def world(db):
    w = World(db)
    w.sid = await w.populate()
    return w


async def counts(db, user: str) -> dict[str, int]:
    out = {}
    for table, col in (("facts", "user_id"), ("profile_entries", "user_id"), ("episodes", "user_id"),
                       ("modes", "user_id"), ("messages", "sender_id"), ("conversation_members", "user_id")):
        row = await db.fetchone(f"SELECT COUNT(*) AS n FROM {table} WHERE {col} = ?", (user,))
        out[table] = row["n"]
    row = await db.fetchone("SELECT COUNT(*) AS n FROM procedures WHERE scope = 'user' AND scope_id = ?", (user,))
    out["procedures"] = row["n"]
    return out


async def test_erase_leaves_nothing_of_the_user_anywhere(world):
    db = world.db
    before = await scan(db, ALICE_IDS)
    assert {k.split(":")[0] for k in before} >= {
        "facts", "profile_entries", "episodes", "modes", "messages", "procedures", "inbox",
        "sessions", "conversation_members", "consolidation_writes", "audit"}
    bob_before = await counts(db, BOB)

    result = await erase_user(db, ALICE)

    assert result.counts["facts"] == 2 and result.counts["episodes"] == 2
    left = await scan(db, ALICE_IDS)
    # The audit row naming her is the one place her id remains (accountability).
    assert left == {"audit:ou_alice": 1}, left
    assert await find_user(db, ALICE, skip=("audit",)) == {}
    # Nor her words, or anything derived from them (replies, warm and rolling summaries, writes).
    her_words = ("爱丽丝", "zebra", "alice-group-words", "alice again", "alice opens topic",
                 "reply to alice", "alice-summary", "alice-rolling", "alice-pending")
    assert await scan(db, her_words) == {}
    assert await counts(db, BOB) == bob_before


async def test_erase_removes_her_words_and_the_replies_to_them(world):
    db = world.db
    await erase_user(db, ALICE)
    contents = [r["content"] for r in await db.fetchall("SELECT content FROM messages ORDER BY id")]
    for gone in ("爱丽丝", "zebra", "alice-group-words", "alice again", "reply to alice",
                 "second reply to alice", "alice opens topic", "r1"):
        assert not any(gone in c for c in contents), (gone, contents)
    # Bob's turns in the shared group are intact, replies included.
    assert "bob-group-words @Alice" in contents and "reply to bob" in contents
    assert "bob continues" in contents and "r2" in contents
    # Her p2p session is gone; the group sessions survive, re-titled and re-owned by Bob.
    assert await world.sessions.get(world.sid["a"]) is None
    g2 = await world.sessions.get(world.sid["g2"])
    assert g2.owner_id == BOB and g2.title == "bob continues"
    assert g2.message_count == 2 and g2.user_turns == 1
    # Warm memory derived from her turns is gone; Bob's pending write stays.
    assert await db.fetchall("SELECT * FROM warm_summaries WHERE session_id = ?", (world.sid["g"],)) == []
    assert (await world.progress.state(world.sid["g"])).rolling_summary == ""
    assert [w[2] for w in await world.progress.pending_writes(world.sid["g"])] == [BOB]
    # Full-text search no longer finds her words.
    assert await world.sessions.search("zebra-painting") == []
    assert await world.episodes.search(ALICE, "guitar") == []
    # Bob's p2p episode is his alone; his episode of the group they shared is rebuilt from
    # what he said there (its summary may have quoted her)
    assert [e.session_id for e in await world.episodes.search(BOB, "guitar")] == [world.sid["b"]]
    assert [e.session_id for e in await world.episodes.search(BOB, "group-words")] == [world.sid["g"]]


async def test_erase_keeps_the_inbox_as_dedup_record_and_drops_her_outbox(world):
    db = world.db
    await erase_user(db, ALICE)
    rows = await db.fetchall("SELECT message_id, payload, note FROM inbox ORDER BY id")
    erased = [r for r in rows if r["payload"] == ERASED_PAYLOAD]
    assert len(erased) == 5 and all(r["note"] == "erased" for r in erased)
    # A redelivery of one of her events is still recognised as seen.
    again = await world.inbox.accept(event_id="ev_other", message_id=erased[0]["message_id"], chat_id=P2P_A,
                                     conv_key=P2P_A, create_time=time.time(), payload="{}")
    assert again is None
    # Bob's event that mentioned her still parses; the mention lost her ids and name.
    bob_event = next(json.loads(r["payload"]) for r in rows if "bob-group-words" in r["payload"])
    [m] = bob_event["event"]["message"]["mentions"]
    assert m["id"] == {"union_id": "", "user_id": "", "open_id": ""} and m["name"] == ""
    outbox = [r["reply_to"] for r in await db.fetchall("SELECT reply_to FROM outbox")]
    assert len(outbox) == 4   # Bob's four replies, and only Bob's
    senders = {r["message_id"] for r in rows if r["payload"] != ERASED_PAYLOAD}
    assert set(outbox) <= senders


async def test_erase_is_one_transaction(world):
    db = world.db
    before = await scan(db, ALICE_IDS)
    # Make the last table fail half-way (a temporary trigger: SQLite's own abort, no mocks).
    await fail_inserts(db, "modes", "boom", event="DELETE")
    with pytest.raises(Exception, match="boom"):
        await erase_user(db, ALICE)
    await restore_inserts(db, "modes")
    assert await scan(db, ALICE_IDS) == before
    assert await world.sessions.get(world.sid["a"]) is not None


async def test_erase_of_unknown_or_empty_user(db):
    result = await erase_user(db, "ou_nobody")
    assert result.total == 0
    with pytest.raises(ValueError):
        await erase_user(db, "  ")


async def test_chat_rules_she_set_stay_with_the_chat(world):
    await erase_user(world.db, ALICE)
    rules = await world.procedures.list(BOB, GROUP)
    assert "chat rule by alice" in [r.rule for r in rules]
    assert all(r.created_by != ALICE for r in rules)


# -- deleting a session: what was learned only from it (DESIGN.md §4) ----------------------------


async def test_deleting_a_session_removes_profile_entries_learned_only_there(db):
    from memory.governance.erase import delete_session

    sessions, profile = SessionStore(db), ProfileStore(db)
    alice = Scope(user_id=ALICE, chat_id=P2P_A, chat_type="p2p", message_id="om_1")
    first = (await sessions.append_user(alice, "我想转行做设计")).session.id
    await sessions.close_active(P2P_A)
    second = (await sessions.append_user(alice, "继续聊转行")).session.id
    await profile.update(alice, "goals", "转行做产品设计", session_id=first)          # only there
    await profile.update(alice, "identity", "住在杭州", session_id=first)             # taught twice
    await profile.update(alice, "identity", "住在杭州", session_id=second)
    await profile.update(alice, "work style", "回答长度：简短", session_id=second)
    # replaced in place by the deleted session: the entry now holds its words only
    await profile.update(alice, "work style", "回答长度：详细", "merge", session_id=first)
    await profile.apply_extraction(alice, ["最近焦虑"], companion=True, session_id=first)
    await profile.update(alice, "agreements", "每周一提醒我复盘")                      # no session known: kept
    await profile.write_document(ALICE, (await profile.read_document(ALICE)) .replace(
        "## 个人语言与激励\n", "## 个人语言与激励\n- 慢慢来\n"))                          # typed by her: kept
    counts = await delete_session(db, first)
    assert counts["profile_entries"] == 3 and counts["sessions"] == 1, counts
    left = sorted(e.entry for e in await profile.list(ALICE))
    assert left == sorted(["住在杭州", "每周一提醒我复盘", "慢慢来"])
    # and the other session's provenance still counts: deleting it removes what it alone taught
    counts = await delete_session(db, second)
    assert counts["profile_entries"] == 1
    assert sorted(e.entry for e in await profile.list(ALICE)) == sorted(["每周一提醒我复盘", "慢慢来"])
    rows = await db.fetchall("SELECT session_id FROM profile_sources")
    assert rows == []


async def test_a_fact_and_an_entry_she_typed_stay_when_their_session_goes(db):
    from memory.governance.erase import delete_session

    sessions, facts, profile = SessionStore(db), FactStore(db), ProfileStore(db)
    alice = Scope(user_id=ALICE, chat_id=P2P_A, chat_type="p2p", message_id="om_1")
    sid = (await sessions.append_user(alice, "记住我喜欢乌龙茶")).session.id
    await facts.add(alice, "用户喜欢乌龙茶", "preference", source="agent_proactive", session_id=sid)
    await facts.add(alice, "用户养猫", "knowledge", source="user_edit", session_id=sid)
    await profile.update(alice, "goals", "学茶艺", source="user_edit", session_id=sid)
    counts = await delete_session(db, sid)
    assert (counts["facts"], counts["profile_entries"]) == (1, 0)
    assert [f.content for f in await facts.list(ALICE)] == ["用户养猫"]
    assert [e.entry for e in await profile.list(ALICE)] == ["学茶艺"]


# -- other members' group episodes (DESIGN.md §4; memory/governance/erase.py) --------------------------------

CAROL = "ou_carol"


async def test_other_members_group_episodes_lose_her_words_and_keep_theirs(db, backend):
    from memory.governance.erase import REDACTED_MODEL

    sessions, episodes = SessionStore(db), EpisodeStore(db)
    n = iter(range(100))

    async def say(user, chat, text):
        scope = Scope(user_id=user, chat_id=chat, chat_type="group", message_id=f"om_g{next(n)}")
        return (await sessions.append_user(scope, text, sender_name=user[3:].title())).session.id

    sid = await say(ALICE, GROUP, "我下周去 zebra 市出差。顺便见客户")
    await say(BOB, GROUP, "我负责订 kiwi 酒店")
    await say(ALICE, GROUP, "我的护照快过期了")
    await say(BOB, GROUP, "我下周也在 kiwi 开会")
    lines = ["[Alice] 我下周去 zebra 市出差。顺便见客户", "[Bob] 我负责订 kiwi 酒店",
             "[Alice] 我的护照快过期了", "[Bob] 我下周也在 kiwi 开会"]
    # what a model writes over the whole session: it quotes and paraphrases her
    summary = "Alice 下周去 zebra 市出差，护照快过期；Bob 订 kiwi 酒店并在那里开会。"
    for user in (ALICE, BOB):
        await episodes.write(session_id=sid, user_id=user, chat_id=GROUP, chat_type="group", summary=summary,
                             turn_count=2, turns=lines, model="claude-haiku-4-5")
    other = await say(BOB, "oc_group2", "和 Carol 讨论 mango 项目")          # she never spoke there
    await say(CAROL, "oc_group2", "mango 项目下周上线")
    untouched = await episodes.write(session_id=other, user_id=CAROL, chat_id="oc_group2", chat_type="group",
                                     summary="Bob 和 Carol 讨论 mango 项目上线", turn_count=2,
                                     turns=["[Bob] 和 Carol 讨论 mango 项目", "[Carol] mango 项目下周上线"])

    result = await erase_user(db, ALICE)

    assert (result.counts["episodes"], result.counts["episodes_redacted"]) == (1, 1), result.counts
    [bob_ep] = await episodes.list(BOB)
    assert bob_ep.session_id == sid and bob_ep.model == REDACTED_MODEL
    assert bob_ep.summary == "[Bob] 我负责订 kiwi 酒店 [Bob] 我下周也在 kiwi 开会"   # his own words, kept
    assert await episodes.turns(bob_ep.id) == ["[Bob] 我负责订 kiwi 酒店", "[Bob] 我下周也在 kiwi 开会"]
    assert "zebra" not in " ".join(bob_ep.keywords)
    # her words, the model's paraphrase of them and her name are nowhere
    assert await scan(db, ("zebra", "护照", "Alice", "出差")) == {}
    assert (await episodes.get(CAROL, untouched.id)).summary == untouched.summary
    if backend == "sqlite":          # episode search is not yet on PostgreSQL
        assert [e.id for e in await episodes.search(BOB, "kiwi 酒店")] == [bob_ep.id]
        assert await episodes.search(BOB, "zebra 护照 出差") == []


async def test_a_group_episode_with_none_of_the_others_lines_left_is_dropped(db):
    sessions, episodes = SessionStore(db), EpisodeStore(db)
    scope = Scope(user_id=ALICE, chat_id=GROUP, chat_type="group", message_id="om_x1")
    said = await sessions.append_user(scope, "只有我说话", sender_name="Alice")
    sid = said.session.id
    # the episode covers only her line (his came after it was written)
    await ConsolidationStore(db).mark_episode(sid, said.message.id)
    bob = Scope(user_id=BOB, chat_id=GROUP, chat_type="group", message_id="om_x2")
    await sessions.append_user(bob, "后来我才说话", sender_name="Bob")
    await episodes.write(session_id=sid, user_id=BOB, chat_id=GROUP, chat_type="group",
                         summary="Alice 说只有她说话", turn_count=2, turns=["[Alice] 只有我说话"])
    result = await erase_user(db, ALICE)
    assert result.counts["episodes_dropped"] == 1
    assert await episodes.list(BOB) == []


async def test_erase_removes_what_others_learned_only_from_the_sessions_it_deletes(db):
    # A session only she spoke in goes with her; a memory of Bob's sourced only there (say he
    # read along and a tool wrote for him) goes too, one he also learned elsewhere stays.
    sessions, facts, profile = SessionStore(db), FactStore(db), ProfileStore(db)
    hers = (await sessions.append_user(Scope(ALICE, P2P_A, "p2p", message_id="om_h"), "只有我")).session.id
    his = (await sessions.append_user(Scope(BOB, P2P_B, "p2p", message_id="om_b"), "我的会话")).session.id
    bob = Scope(BOB, P2P_B, "p2p")
    await facts.add(bob, "Bob 喜欢爬山", "preference", source="consolidator", session_id=hers)
    await facts.add(bob, "Bob 住在成都", "knowledge", source="consolidator", session_id=hers)
    await facts.add(bob, "Bob 住在成都", "knowledge", source="consolidator", session_id=his)
    await profile.update(bob, "goals", "爬完四姑娘山", session_id=hers)
    result = await erase_user(db, ALICE)
    assert (result.counts["others_facts"], result.counts["others_profile_entries"]) == (1, 1)
    assert [f.content for f in await facts.list(BOB)] == ["Bob 住在成都"]
    assert await profile.list(BOB) == []
    assert await db.fetchall("SELECT session_id FROM fact_sources WHERE session_id = ?", (hers,)) == []
