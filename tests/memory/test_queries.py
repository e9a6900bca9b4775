"""memory/queries.py: the reads one message makes of several stores (its mode, the rules, the
profile, the top facts with their touch) sent together give what each store gives alone, in one
round trip on both engines, and each store's read stays scoped to its owner."""

from __future__ import annotations

import pytest

from memory.facts.store import FactStore
from memory.profile.modes import COMPANION, WORK, ModeStore
from memory.procedures import ProcedureStore
from memory.profile.store import BASICS, PSYCH, ProfileStore
from memory.queries import answer, fetch_together
from memory.scope import Scope
from tests.memory.test_facts import Clock
from tests.round_trips import counting_round_trips

ANN = Scope(user_id="ou_ann", chat_id="oc_ann_dm", chat_type="p2p", message_id="om_1")
ANN_GROUP = Scope(user_id="ou_ann", chat_id="oc_team", chat_type="group", message_id="om_2")
BOB = Scope(user_id="ou_bob", chat_id="oc_bob_dm", chat_type="p2p", message_id="om_3")


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
async def stores(db, clock):
    facts, rules, profile, modes = FactStore(db, clock=clock), ProcedureStore(db), ProfileStore(db), ModeStore(db)
    for scope, who in ((ANN, "ann"), (BOB, "bob")):
        await facts.add(scope, f"{who} drinks green tea every morning", "knowledge", source="consolidator")
        await facts.add(scope, f"{who} plays the cello on weekends", "knowledge", source="consolidator")
        await rules.add(scope, f"answer {who} in short sentences")
        await profile.update(scope, BASICS, f"{who} is a violinist")
        await profile.update(scope, PSYCH, f"{who} is anxious before concerts")
    await modes.set("ou_ann", ANN.conv_key, COMPANION)
    return facts, rules, profile, modes


def _reads(stores, scope):
    facts, rules, profile, modes = stores
    return [rules.for_request_query(scope), profile.for_prompt_query(scope), facts.top_read(scope, k=5, touch=False),
            modes.get_query(scope.user_id, scope.conv_key), answer("given")]


async def test_reads_sent_together_answer_as_each_store_alone_in_one_round_trip(db, stores):
    facts, rules, profile, modes = stores
    for scope in (ANN, ANN_GROUP, BOB):
        alone = [await rules.for_request(scope), await profile.for_prompt(scope),
                 await facts.top(scope, k=5, touch=False), await modes.get(scope.user_id, scope.conv_key), "given"]
        with counting_round_trips(db) as trips:
            together = await fetch_together(db, _reads(stores, scope))
        assert trips["n"] == 1, trips
        assert together == alone
    ann, bob = await fetch_together(db, [facts.top_read(ANN, k=5, touch=False), facts.top_read(BOB, k=5, touch=False)])
    assert {f.user_id for f in ann} == {"ou_ann"} and {f.user_id for f in bob} == {"ou_bob"}
    group, private = await fetch_together(db, _reads(stores, ANN_GROUP)), await fetch_together(db, _reads(stores, ANN))
    assert "anxious" in private[1] and "violinist" in private[1] and "bob" not in private[1]
    assert group[1] == ""                 # what was learned in private stays out of a group
    assert group[3] == WORK and private[3] == COMPANION


async def test_the_facts_touch_rides_along(db, stores, clock):
    facts, rules, profile, modes = stores
    now = clock.tick(100)
    with counting_round_trips(db) as trips:
        top, mode = await fetch_together(db, [facts.top_read(ANN, k=5), modes.get_query("ou_ann", ANN.conv_key)])
    assert trips["n"] == 1, trips
    assert top and {f.last_accessed for f in top} == {now} and mode == COMPANION
    assert {f.id: f.last_accessed for f in await facts.list("ou_ann")} == {f.id: now for f in top}
    assert all(f.last_accessed < now for f in await facts.list("ou_bob"))
    assert await fetch_together(db, [answer(1), answer(2)]) == [1, 2]
