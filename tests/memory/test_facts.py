"""FactStore: confidence, reinforcement, supersession, capacity, injection, scope, secrets."""

from __future__ import annotations

import pytest

from memory.facts.confidence import initial_confidence
from memory.facts.matching import relation
from memory.facts.store import (
    MAX_CONTENT_CHARS,
    FactStore,
    top_query,
    touch_top_query,
)
from memory.scope import Scope

A_P2P = Scope(user_id="ou_alice", chat_id="oc_alice_dm", chat_type="p2p", message_id="om_a1")
A_GROUP = Scope(user_id="ou_alice", chat_id="oc_team", chat_type="group", message_id="om_g1")
B_P2P = Scope(user_id="ou_bob", chat_id="oc_bob_dm", chat_type="p2p", message_id="om_b1")
B_GROUP = Scope(user_id="ou_bob", chat_id="oc_team", chat_type="group", message_id="om_g2")


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def tick(self, dt: float = 1.0) -> float:
        self.t += dt
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(db, clock):
    return FactStore(db, clock=clock)


def with_msg(scope: Scope, message_id: str) -> Scope:
    return Scope(scope.user_id, scope.chat_id, scope.chat_type, scope.thread_id, message_id, scope.is_admin)


# -- confidence ---------------------------------------------------------------------------

async def test_confidence_by_source_and_provenance(store):
    w = await store.add(A_P2P, "用户是后端工程师", "knowledge", source="consolidator")
    assert w.action == "added"
    f = w.fact
    assert (f.confidence, f.source, f.visibility) == (0.8, "consolidator", "private")
    assert (f.user_id, f.chat_id, f.message_id, f.hit_count) == ("ou_alice", "oc_alice_dm", "om_a1", 0)
    assert f.active and f.superseded_by is None

    f = (await store.add(A_P2P, "用户住在杭州", "knowledge", source="agent_proactive")).fact
    assert (f.confidence, f.visibility) == (0.95, "private")
    f = (await store.add(A_GROUP, "用户负责支付系统", "knowledge", source="agent_proactive")).fact
    assert (f.confidence, f.visibility) == (0.95, "shared")
    f = (await store.add(A_P2P, "用户的生日在五月", "knowledge", source="user_edit")).fact
    assert (f.confidence, f.visibility) == (1.0, "shared")
    f = (await store.add(A_P2P, "用户养了一只猫", "knowledge", source="consolidator", confidence=0.42)).fact
    assert f.confidence == 0.42


def test_ordinary_extraction_band_is_0_8_scaled_down_by_importance():
    """The spec's 默认提炼 80%: an ordinary fact starts at 0.8 — not 0.9, which a 「记住」 gets."""
    assert initial_confidence("consolidator") == 0.8
    assert initial_confidence("consolidator", user_text="今天天气不错") == 0.8
    assert initial_confidence("consolidator", importance=0.8) == 0.8      # the extractor's "ordinary"
    assert initial_confidence("consolidator", importance=0.85) == 0.8     # never above the band
    assert initial_confidence("consolidator", importance=0.89) == 0.8
    assert initial_confidence("consolidator", importance=0.55) == 0.75    # scaled within the band
    assert initial_confidence("consolidator", importance=0.3) == 0.7
    assert initial_confidence("consolidator", importance=0.0) == 0.7
    ordinary = [initial_confidence("consolidator", importance=i / 100) for i in range(30, 90)]
    assert ordinary == sorted(ordinary) and 0.7 <= min(ordinary) <= max(ordinary) <= 0.8


def test_strong_signal_band_is_0_9_to_0_95():
    """强信号加权: the extractor's importance 0.9–0.95, or 记住 / 纠正 / 偏好 in the user's words."""
    assert initial_confidence("consolidator", importance=0.9) == 0.9
    assert initial_confidence("consolidator", importance=0.93) == 0.93
    assert initial_confidence("consolidator", importance=0.95) == 0.95
    assert initial_confidence("consolidator", importance=1.0) == 0.95     # capped: 1.0 is the user's own
    assert initial_confidence("consolidator", user_text="记住，我喝咖啡不加糖") == 0.9
    assert initial_confidence("consolidator", user_text="记住，回复一定要用中文") == 0.95
    assert initial_confidence("consolidator", user_text="Please remember I use vim") == 0.9
    assert initial_confidence("consolidator", user_text="Remember: I always use vim") == 0.95
    assert initial_confidence("consolidator", user_text="I prefer tea") == 0.9
    assert initial_confidence("consolidator", user_text="记住", importance=0.2) == 0.9
    assert initial_confidence("consolidator", user_text="记住", importance=0.94) == 0.94


def test_proactive_and_user_edit_are_fixed():
    # fixed for the tool and the user's own edits, whatever the words
    assert initial_confidence("agent_proactive", user_text="hello") == 0.95
    assert initial_confidence("agent_proactive", user_text="记住！一定要！", importance=0.3) == 0.95
    assert initial_confidence("user_edit") == 1.0


async def test_add_uses_user_text_and_importance(store):
    f = (await store.add(A_P2P, "用户喝咖啡不加糖", "preference", source="consolidator",
                         user_text="记住，我喝咖啡不加糖")).fact
    assert f.confidence == 0.9
    f = (await store.add(A_P2P, "User deploys on Fridays", "decision", source="consolidator",
                         importance=0.95)).fact
    assert f.confidence == 0.95


# -- reinforcement ------------------------------------------------------------------------

@pytest.mark.parametrize(
    "first, again",
    [
        ("用户喜欢喝咖啡", "用户喜欢喝咖啡。"),
        ("用户喜欢喝咖啡", "  用户 喜欢喝咖啡！ "),
        ("User prefers dark mode", "user prefers dark mode!"),
        ("User prefers dark mode in all editors", "User prefers dark mode in all the editors"),
        ("用户的猫叫咪咪，今年三岁，很喜欢吃鱼", "用户的猫叫咪咪，今年三岁，很喜欢吃鱼啊"),
    ],
)
async def test_same_fact_reinforces_instead_of_duplicating(store, clock, first, again):
    w1 = await store.add(A_P2P, first, "preference", source="consolidator")
    t_learned = clock.tick(60)
    w2 = await store.add(with_msg(A_P2P, "om_a2"), again, "preference", source="consolidator")
    assert w2.action == "reinforced"
    assert w2.fact.id == w1.fact.id
    assert w2.fact.content == first                  # the wording first learned is kept
    assert w2.fact.confidence == pytest.approx(0.85)
    assert w2.fact.hit_count == 1
    assert w2.fact.last_accessed == t_learned
    # provenance stays the first learning; every learning is a source (issue 32)
    assert w2.fact.message_id == A_P2P.message_id
    assert await store.sources("ou_alice", [w1.fact.id]) == {w1.fact.id: [
        *([(A_P2P.chat_id, A_P2P.message_id, w1.fact.created_at)] if A_P2P.message_id else []),
        (A_P2P.chat_id, "om_a2", t_learned)]}
    assert w2.fact.created_at == w1.fact.created_at
    assert await store.count("ou_alice") == 1
    assert await store.count("ou_alice", include_superseded=True) == 1


async def test_reinforcement_caps_and_never_lowers(store):
    for _ in range(10):
        w = await store.add(A_P2P, "用户喜欢喝咖啡", "preference", source="consolidator")
    assert w.fact.confidence == 0.99
    assert w.fact.hit_count == 9

    await store.add(A_P2P, "User lives in Berlin", "knowledge", source="user_edit")
    w = await store.add(A_P2P, "user lives in Berlin.", "knowledge", source="consolidator")
    assert w.action == "reinforced"
    assert w.fact.confidence == 1.0                  # a 1.0 edit is never lowered
    assert w.fact.source == "user_edit"

    await store.add(A_P2P, "用户用 Vim", "knowledge", source="consolidator", confidence=0.5)
    w = await store.add(A_P2P, "用户用Vim", "knowledge", source="agent_proactive")
    assert w.fact.confidence == 0.99                 # max(0.5, 0.95) + step, capped
    assert w.fact.source == "agent_proactive"        # the more authoritative source


async def test_relearning_in_a_group_widens_visibility(store):
    w1 = await store.add(A_P2P, "用户喜欢喝咖啡", "preference", source="consolidator")
    assert w1.fact.visibility == "private"
    assert await store.top(A_GROUP) == []
    w2 = await store.add(A_GROUP, "用户喜欢喝咖啡", "preference", source="consolidator")
    # shared now; provenance stays the first learning, the group message one more source
    assert (w2.action, w2.fact.visibility, w2.fact.chat_id) == ("reinforced", "shared", "oc_alice_dm")
    assert [m for _, m, _ in (await store.sources("ou_alice", [w1.fact.id]))[w1.fact.id]] == ["om_a1", "om_g1"]
    assert [f.id for f in await store.top(A_GROUP)] == [w1.fact.id]


# -- supersession -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "old, new, category",
    [
        ("用户住在北京", "用户住在上海", "correction"),
        ("用户住在北京", "用户现在住在上海", "knowledge"),
        ("用户喜欢喝咖啡", "用户不喜欢喝咖啡", "preference"),
        ("用户喜欢喝咖啡", "用户不再喝咖啡了", "preference"),
        ("用户每天跑步5公里", "用户每天跑步10公里", "knowledge"),
        ("用户在 Acme Corp 担任后端工程师", "用户在 Acme Corp 担任前端工程师", "correction"),
        ("用户的生日是3月5日", "用户的生日是3月6日", "knowledge"),
        ("User prefers dark mode", "User now prefers light mode", "preference"),
        ("User prefers dark mode", "User prefers light mode", "correction"),
        ("User likes coffee", "User doesn't like coffee", "preference"),
        ("User has 2 kids", "User has 3 kids", "knowledge"),
    ],
)
async def test_contradiction_supersedes_and_keeps_the_old_fact(store, clock, old, new, category):
    w_old = await store.add(A_P2P, old, "knowledge", source="consolidator")
    t = clock.tick(10)
    w_new = await store.add(A_P2P, new, category, source="consolidator")
    assert w_new.action == "superseded"
    assert w_new.superseded == (w_old.fact.id,)
    assert w_new.fact.id != w_old.fact.id
    kept = await store.get("ou_alice", w_old.fact.id)
    assert kept is not None                           # never deleted
    assert kept.superseded_at == t and kept.superseded_by == w_new.fact.id and not kept.active
    assert [f.content for f in await store.top(A_P2P, touch=False)] == [w_new.fact.content]
    assert [f.id for f in await store.list("ou_alice")] == [w_new.fact.id]
    history = await store.list("ou_alice", include_superseded=True)
    assert [f.id for f in history] == [w_new.fact.id, w_old.fact.id]
    assert await store.count("ou_alice") == 1


@pytest.mark.parametrize(
    "old, new, category",
    [
        ("用户喜欢喝咖啡", "用户喜欢喝茶", "preference"),      # both can be true
        ("用户喜欢喝咖啡", "用户不喜欢喝茶了", "correction"),  # negates something else
        ("用户不吃辣", "用户不吃香菜", "preference"),
        ("User prefers dark mode", "User prefers light mode", "preference"),  # no signal of change
        ("用户住在北京", "用户喜欢吃火锅", "correction"),        # a correction about something else
        ("用户的女儿在北京大学读计算机专业", "用户的儿子在北京大学读计算机专业", "knowledge"),  # substituted, no signal
        ("用户在 Acme Corp 担任后端工程师", "用户在 Acme Corp 担任前端工程师", "knowledge"),
    ],
)
async def test_unrelated_or_compatible_facts_are_both_kept(store, old, new, category):
    await store.add(A_P2P, old, "preference", source="consolidator")
    w = await store.add(A_P2P, new, category, source="consolidator")
    assert w.action == "added" and w.superseded == ()
    assert await store.count("ou_alice") == 2


def test_relation_heuristic_directly():
    assert relation("用户喜欢喝咖啡。", "用户喜欢喝咖啡") == "same"
    assert relation("User dislikes coffee", "User likes coffee") == "contradicts"
    assert relation("用户的生日是3月6日", "用户的生日是3月5日") == "contradicts"
    assert relation("Bob is allergic to peanuts", "Alice is allergic to peanuts") == "unrelated"
    assert relation("Bob is allergic to peanuts", "Alice is allergic to peanuts", category="correction") == "contradicts"
    assert relation("User has kids", "User has 2 kids") == "same"       # only a detail dropped
    assert relation("用户住在上海", "用户住在北京") == "unrelated"
    assert relation("用户住在上海", "用户住在北京", category="correction") == "contradicts"


async def test_reinforcing_a_fact_also_supersedes_what_contradicts_it(store):
    shanghai = (await store.add(A_P2P, "用户住在上海", "knowledge", source="consolidator")).fact
    beijing = (await store.add(A_P2P, "用户住在北京", "knowledge", source="consolidator")).fact
    w = await store.add(A_P2P, "用户住在上海。", "correction", source="agent_proactive")
    assert w.action == "reinforced" and w.fact.id == shanghai.id
    assert w.superseded == (beijing.id,)
    assert (await store.get("ou_alice", beijing.id)).superseded_by == shanghai.id


async def test_p2p_correction_does_not_reveal_itself_in_groups(store):
    shared = (await store.add(A_GROUP, "用户住在北京", "knowledge", source="consolidator")).fact
    w = await store.add(A_P2P, "用户住在上海", "correction", source="consolidator")
    assert w.superseded == (shared.id,) and w.fact.visibility == "private"
    assert await store.top(A_GROUP) == []            # old one gone, new one stays private
    assert [f.id for f in await store.top(A_P2P)] == [w.fact.id]


# -- capacity -----------------------------------------------------------------------------

async def test_eviction_lowest_confidence_then_longest_unaccessed(db, clock):
    store = FactStore(db, capacity=3, clock=clock)
    low = (await store.add(A_P2P, "fact one about tea", "knowledge", source="consolidator", confidence=0.4)).fact
    clock.tick()
    old = (await store.add(A_P2P, "fact two about cars", "knowledge", source="consolidator")).fact
    clock.tick()
    recent = (await store.add(A_P2P, "fact three about hiking", "knowledge", source="consolidator")).fact
    clock.tick()

    four = await store.add(A_P2P, "fact four about music", "knowledge", source="consolidator")
    assert four.evicted == (low.id,)                  # lowest confidence first
    assert await store.get("ou_alice", low.id) is None   # evicted = deleted
    clock.tick()
    five = await store.add(A_P2P, "fact five about chess", "knowledge", source="consolidator")
    assert five.evicted == (old.id,)                  # same confidence: longest unaccessed
    assert {f.id for f in await store.list("ou_alice")} == {recent.id, four.fact.id, five.fact.id}


async def test_injection_touch_protects_from_eviction(db, clock):
    store = FactStore(db, capacity=2, clock=clock)
    older = (await store.add(A_GROUP, "Alice owns the billing service", "knowledge", source="consolidator")).fact
    clock.tick()
    newer = (await store.add(A_P2P, "Alice is job hunting", "knowledge", source="consolidator")).fact
    clock.tick()
    assert [f.id for f in await store.top(A_GROUP)] == [older.id]   # touches the shared one only
    clock.tick()
    w = await store.add(A_P2P, "Alice runs marathons", "knowledge", source="consolidator")
    assert w.evicted == (newer.id,)


async def test_new_fact_is_never_its_own_eviction_and_history_is_not_counted(db, clock):
    store = FactStore(db, capacity=2, clock=clock)
    await store.add(A_P2P, "用户住在北京", "knowledge", source="consolidator", confidence=0.9)
    await store.add(A_P2P, "用户住在上海", "correction", source="consolidator", confidence=0.9)
    assert await store.count("ou_alice", include_superseded=True) == 2
    assert await store.count("ou_alice") == 1
    await store.add(A_P2P, "用户喜欢爬山", "preference", source="consolidator", confidence=0.9)
    w = await store.add(A_P2P, "用户喜欢看电影", "preference", source="consolidator", confidence=0.1)
    assert w.action == "added" and w.fact.confidence == 0.1
    assert await store.get("ou_alice", w.fact.id) is not None
    assert len(w.evicted) == 1
    assert await store.count("ou_alice") == 2
    assert await store.count("ou_alice", include_superseded=True) == 3   # history untouched


async def test_capacity_is_per_user(db, clock):
    store = FactStore(db, capacity=2, clock=clock)
    for i, word in enumerate(["tea", "cars", "music"]):
        await store.add(A_P2P, f"Alice fact about {word}", "knowledge", source="consolidator")
        await store.add(B_P2P, f"Bob fact about {word}", "knowledge", source="consolidator")
    assert await store.count("ou_alice") == 2
    assert await store.count("ou_bob") == 2


# -- injection ----------------------------------------------------------------------------

async def test_top_order_threshold_and_k(store, clock):
    await store.add(A_P2P, "below threshold", "knowledge", source="consolidator", confidence=0.29)
    at = (await store.add(A_P2P, "exactly at threshold", "knowledge", source="consolidator", confidence=0.3)).fact
    clock.tick()
    hi_old = (await store.add(A_P2P, "high confidence older", "knowledge", source="consolidator", confidence=0.9)).fact
    clock.tick()
    hi_new = (await store.add(A_P2P, "high confidence newer", "knowledge", source="consolidator", confidence=0.9)).fact
    clock.tick()
    top = (await store.add(A_P2P, "highest of all", "knowledge", source="user_edit")).fact

    got = await store.top(A_P2P, touch=False)
    assert [f.id for f in got] == [top.id, hi_new.id, hi_old.id, at.id]
    assert "below threshold" not in [f.content for f in got]
    assert [f.id for f in await store.top(A_P2P, k=2, touch=False)] == [top.id, hi_new.id]
    assert await store.top(A_P2P, k=0) == []


async def test_top_returns_at_most_k(store, clock):
    words = "apple banana cherry dates elder figs grape honey iris jade kiwi lemon mango nut olive pear quince rose sage thyme".split()
    for i, w in enumerate(words):
        await store.add(A_P2P, w, "knowledge",
                        source="consolidator", confidence=0.5 + i * 0.01)
        clock.tick()
    assert await store.count("ou_alice") == 20
    top15 = await store.top(A_P2P, touch=False)
    top5 = await store.top(A_P2P, k=5, touch=False)
    assert len(top15) == 15 and len(top5) == 5
    assert [f.id for f in top5] == [f.id for f in top15[:5]]
    assert [f.confidence for f in top15] == sorted((f.confidence for f in top15), reverse=True)
    assert top5[0].content == "thyme"


async def test_touch_updates_last_accessed_of_returned_rows_only(store, clock):
    a = (await store.add(A_P2P, "first fact about tea", "knowledge", source="consolidator", confidence=0.9)).fact
    b = (await store.add(A_P2P, "second fact about cars", "knowledge", source="consolidator", confidence=0.5)).fact
    t0 = a.last_accessed
    t1 = clock.tick(100)
    untouched = await store.top(A_P2P, k=1, touch=False)
    assert untouched[0].last_accessed == t0
    assert (await store.get("ou_alice", a.id)).last_accessed == t0

    got = await store.top(A_P2P, k=1)
    assert [f.id for f in got] == [a.id] and got[0].last_accessed == t1
    stored_a = await store.get("ou_alice", a.id)
    assert stored_a.last_accessed == t1
    assert stored_a.hit_count == 0                    # injection is not a hit
    assert (await store.get("ou_alice", b.id)).last_accessed == t0


async def test_top_with_touch_is_one_round_trip_and_touches_only_the_owners_rows(store, db, clock):
    """Every message reads the user's top facts and marks them accessed: one round trip on both
    engines (SQLite: one hop to its thread; PostgreSQL: one statement, the touch a
    data-modifying CTE), in ranking order, and another user's facts are left as they were."""
    from tests.round_trips import counting_round_trips
    topics = ["drinks green tea every morning", "plays the cello on weekends", "lives in Hangzhou",
              "is allergic to peanuts"]
    mine = [(await store.add(A_P2P, t, "knowledge", source="consolidator", confidence=0.9 - i / 100)).fact
            for i, t in enumerate(topics)]
    bob = (await store.add(B_P2P, "bob's fact about cars", "knowledge", source="consolidator", confidence=0.95)).fact
    t1 = clock.tick(100)
    with counting_round_trips(db) as trips:
        got = await store.top(A_P2P, k=3)
    assert trips["n"] == 1, trips
    assert [f.id for f in got] == [f.id for f in mine[:3]] and {f.last_accessed for f in got} == {t1}
    stored = {f.id: (await store.get("ou_alice", f.id)).last_accessed for f in mine}
    assert stored == {mine[0].id: t1, mine[1].id: t1, mine[2].id: t1, mine[3].id: mine[3].last_accessed}
    assert (await store.get("ou_bob", bob.id)).last_accessed == bob.last_accessed
    with counting_round_trips(db) as trips:
        assert await store.top(Scope(user_id="ou_nobody", chat_id="oc_x", chat_type="p2p"), k=3) == []
    assert trips["n"] == 1, trips


@pytest.mark.parametrize("backend", ["sqlite"])   # SQLite's query plan
async def test_top_uses_the_partial_indexes_without_sorting(db):
    for scope, index in ((A_P2P, "facts_active"), (A_GROUP, "facts_active_shared")):
        sql, params = top_query(scope, 15)
        plan = " | ".join(r["detail"] for r in await db.fetchall("EXPLAIN QUERY PLAN " + sql, params))
        assert f"USING INDEX {index} " in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    sql, params = touch_top_query(A_P2P, 15, 1.0)
    plan = [r["detail"] for r in await db.fetchall("EXPLAIN QUERY PLAN " + sql, params)]
    assert plan[0] == "SEARCH facts USING INTEGER PRIMARY KEY (rowid=?)", plan    # the touch: by id
    assert any("USING INDEX facts_active " in p for p in plan[1:]) and not any("TEMP B-TREE" in p for p in plan), plan


# -- scope and visibility -----------------------------------------------------------------

async def test_users_never_see_each_others_facts(store):
    a = (await store.add(A_P2P, "Alice is allergic to peanuts", "knowledge", source="agent_proactive")).fact
    ag = (await store.add(A_GROUP, "Alice leads the payments team", "knowledge", source="agent_proactive")).fact
    b = (await store.add(B_P2P, "Bob is allergic to peanuts", "knowledge", source="agent_proactive")).fact

    assert [f.id for f in await store.top(B_P2P)] == [b.id]
    assert await store.top(B_GROUP) == []
    assert [f.id for f in await store.list("ou_bob", include_superseded=True)] == [b.id]
    assert await store.count("ou_bob") == 1

    # by id, from the wrong user: nothing is read, changed or deleted
    assert await store.get("ou_bob", a.id) is None
    assert await store.update("ou_bob", a.id, content="hijacked") is None
    assert await store.delete("ou_bob", a.id) is False
    assert (await store.get("ou_alice", a.id)).content == "Alice is allergic to peanuts"

    # Bob learning Alice's exact sentence neither reinforces nor supersedes her facts
    w = await store.add(B_GROUP, "Alice leads the payments team", "knowledge", source="consolidator")
    assert w.action == "added" and w.fact.user_id == "ou_bob"
    w = await store.add(B_GROUP, "Alice no longer leads the payments team", "knowledge", source="consolidator")
    assert w.action == "superseded" and (await store.get("ou_alice", ag.id)).active
    assert (await store.get("ou_alice", ag.id)).hit_count == 0

    assert await store.delete_all("ou_bob") == 3
    assert {f.id for f in await store.list("ou_alice")} == {a.id, ag.id}


async def test_private_facts_stay_out_of_groups(store):
    private = (await store.add(A_P2P, "Alice is job hunting", "knowledge", source="agent_proactive")).fact
    shared = (await store.add(A_GROUP, "Alice owns the billing service", "knowledge", source="agent_proactive")).fact
    assert private.visibility == "private" and shared.visibility == "shared"
    assert [f.id for f in await store.top(A_GROUP)] == [shared.id]
    assert {f.id for f in await store.top(A_P2P)} == {private.id, shared.id}
    # any other group sees the shared one only
    other_group = Scope("ou_alice", "oc_other", "group")
    assert [f.id for f in await store.top(other_group)] == [shared.id]


# -- secrets and validation ---------------------------------------------------------------

@pytest.mark.parametrize(
    "content",
    ["我的密码是 abc12345", "Alice's API key is sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123",
     "password: hunter2", "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789ab"],
)
async def test_secrets_are_refused_and_never_stored(store, content):
    with pytest.raises(ValueError, match="never stored"):
        await store.add(A_P2P, content, "knowledge", source="agent_proactive")
    assert await store.count("ou_alice", include_superseded=True) == 0
    f = (await store.add(A_P2P, "Alice uses a password manager", "knowledge", source="consolidator")).fact
    with pytest.raises(ValueError):
        await store.update("ou_alice", f.id, content=content)
    assert (await store.get("ou_alice", f.id)).content == "Alice uses a password manager"


async def test_bad_input_is_refused(store):
    for kwargs, match in [
        (dict(content="", category="knowledge", source="consolidator"), "empty"),
        (dict(content=" 。！ ", category="knowledge", source="consolidator"), "empty"),
        (dict(content="x" * (MAX_CONTENT_CHARS + 1), category="knowledge", source="consolidator"), "too long"),
        (dict(content="fine", category="gossip", source="consolidator"), "category"),
        (dict(content="fine", category="knowledge", source="model"), "source"),
        (dict(content="fine", category="knowledge", source="consolidator", confidence=1.5), "between 0 and 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            await store.add(A_P2P, **kwargs)
    with pytest.raises(ValueError):
        await store.add(Scope("", "oc_x", "p2p"), "fine", "knowledge", source="consolidator")
    assert await store.count("ou_alice", include_superseded=True) == 0
    f = (await store.add(A_P2P, "line one\nline two", "knowledge", source="consolidator")).fact
    assert f.content == "line one line two"          # one line, so it cannot fake prompt structure


# -- console edits ------------------------------------------------------------------------

async def test_update_is_a_user_edit_in_place(store, clock):
    f = (await store.add(A_P2P, "用户住在北京", "knowledge", source="consolidator")).fact
    t = clock.tick()
    g = await store.update("ou_alice", f.id, content="用户住在北京海淀区")
    assert (g.id, g.content, g.source, g.confidence, g.updated_at) == (f.id, "用户住在北京海淀区", "user_edit", 1.0, t)
    assert g.visibility == "private"                  # an edit does not broadcast a private fact
    g = await store.update("ou_alice", f.id, category="decision", confidence=0.6, visibility="shared")
    assert (g.category, g.confidence, g.visibility) == ("decision", 0.6, "shared")
    with pytest.raises(ValueError):
        await store.update("ou_alice", f.id, category="gossip")
    assert await store.update("ou_alice", 999_999, content="x") is None
    # the edited text is what reinforcement matches now
    w = await store.add(A_P2P, "用户住在北京海淀区。", "knowledge", source="consolidator")
    assert w.action == "reinforced" and w.fact.id == f.id


async def test_delete_and_delete_all(store):
    a = (await store.add(A_P2P, "用户住在北京", "knowledge", source="consolidator")).fact
    await store.add(A_P2P, "用户住在上海", "correction", source="consolidator")
    await store.add(A_P2P, "用户喜欢爬山", "preference", source="consolidator")
    assert await store.delete("ou_alice", a.id) is True
    assert await store.delete("ou_alice", a.id) is False
    assert await store.delete_all("ou_alice") == 2
    assert await store.list("ou_alice", include_superseded=True) == []


async def test_the_fact_decision_set(db):
    # issue 19: near-duplicates merge, look-alikes (第1号/第2号邮票, dog/cat) both stay, and a
    # correction (category correction, as memory_write sends it) supersedes the fact it corrects
    from tests.memory import fact_decisions as D

    r = await D.score(lambda: FactStore(db))
    assert r["duplicates"] == 0 and r["look_alikes_lost"] == 0, r["failures"]
    assert r["corrected"] == r["corrections"] == len(D.CORRECT), r["failures"]
    # issue 31: a relative's or colleague's attribute stays apart, "named"/"called" and
    # 的女儿叫/女儿的名字叫 merge, a changed number/date/weekday is never a silent merge
    assert r["changed"] == len(D.CHANGED) and r["changed_merged"] == 0, r["failures"]
