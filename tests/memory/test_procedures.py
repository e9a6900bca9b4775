"""ProcedureStore: de-duplication, user/chat scope, admin-only chat rules, validation."""

from __future__ import annotations

import pytest

from memory.procedures import MAX_RULE_CHARS, ProcedureStore
from memory.scope import Scope

A_P2P = Scope(user_id="ou_alice", chat_id="oc_alice_dm", chat_type="p2p", message_id="om_a1")
A_GROUP = Scope(user_id="ou_alice", chat_id="oc_team", chat_type="group", message_id="om_g1")
A_OTHER_GROUP = Scope(user_id="ou_alice", chat_id="oc_other", chat_type="group")
B_P2P = Scope(user_id="ou_bob", chat_id="oc_bob_dm", chat_type="p2p")
B_GROUP = Scope(user_id="ou_bob", chat_id="oc_team", chat_type="group")
ADMIN_GROUP = Scope(user_id="ou_admin", chat_id="oc_team", chat_type="group", message_id="om_x", is_admin=True)
ADMIN_OTHER = Scope(user_id="ou_admin", chat_id="oc_other", chat_type="group", is_admin=True)


@pytest.fixture
def store(db):
    return ProcedureStore(db)


async def test_add_user_rule_with_provenance(store):
    p, created = await store.add(A_P2P, "  Always reply in Chinese ", "用户明确要求")
    assert created
    assert (p.scope, p.scope_id, p.rule, p.context) == ("user", "ou_alice", "Always reply in Chinese", "用户明确要求")
    assert (p.created_by, p.chat_id, p.message_id, p.visibility) == ("ou_alice", "oc_alice_dm", "om_a1", "private")


@pytest.mark.parametrize(
    "first, again",
    [
        ("Always reply in Chinese", "always reply in chinese."),
        ("回复都用中文", "回复都用中文。"),
        ("Never use emoji", "Don't use emoji"),
        ("Keep answers short and use bullet points for lists", "Keep answers short and use bullet points for all lists"),
    ],
)
async def test_same_rule_is_not_added_twice(store, first, again):
    p1, c1 = await store.add(A_P2P, first)
    p2, c2 = await store.add(A_GROUP, again, "said again in a group")
    assert c1 and not c2
    assert p2.id == p1.id and p2.rule == first
    assert len(await store.list("ou_alice")) == 1


@pytest.mark.parametrize(
    "first, second",
    [
        ("所有回复都使用简体中文，不要使用繁体中文", "所有回复都使用繁体中文，不要使用简体中文"),
        ("Use emoji in replies to casual messages", "Do not use emoji in replies to casual messages"),
        ("Always reply in Chinese", "Always reply in English"),
    ],
)
async def test_different_rules_are_both_kept(store, first, second):
    assert (await store.add(A_P2P, first))[1]
    assert (await store.add(A_P2P, second))[1]
    assert [p.rule for p in await store.list("ou_alice")] == [first, second]


async def test_same_rule_for_two_users_is_two_rules(store):
    pa, _ = await store.add(A_P2P, "Always reply in Chinese")
    pb, created = await store.add(B_P2P, "Always reply in Chinese")
    assert created and pb.id != pa.id and pb.scope_id == "ou_bob"


async def test_chat_rules_need_an_admin(store):
    with pytest.raises(PermissionError, match="only an admin"):
        await store.add(A_GROUP, "No memes in this chat", chat_scope=True)
    assert await store.list("ou_alice", chat_id="oc_team") == []
    p, created = await store.add(ADMIN_GROUP, "No memes in this chat", "team policy", chat_scope=True)
    assert created and (p.scope, p.scope_id, p.created_by) == ("chat", "oc_team", "ou_admin")
    # the same rule for the chat again: de-duplicated
    assert (await store.add(ADMIN_GROUP, "no memes in this chat!", chat_scope=True)) == (p, False)


async def test_for_request_is_chat_rules_then_the_speakers_rules(store):
    chat_rule, _ = await store.add(ADMIN_GROUP, "Answer in English in this chat", chat_scope=True)
    other_chat_rule, _ = await store.add(ADMIN_OTHER, "Use formal language", chat_scope=True)
    alice_rule, _ = await store.add(A_P2P, "Call me Ali")          # set in a direct message
    bob_rule, _ = await store.add(B_P2P, "No emoji for Bob")

    assert [p.id for p in await store.for_request(A_GROUP)] == [chat_rule.id, alice_rule.id]
    assert [p.id for p in await store.for_request(B_GROUP)] == [chat_rule.id, bob_rule.id]
    # user rules apply wherever the user speaks, p2p or any group
    assert [p.id for p in await store.for_request(A_P2P)] == [alice_rule.id]
    assert [p.id for p in await store.for_request(A_OTHER_GROUP)] == [other_chat_rule.id, alice_rule.id]

    assert [p.id for p in await store.list("ou_alice")] == [alice_rule.id]
    assert [p.id for p in await store.list("ou_alice", chat_id="oc_team")] == [chat_rule.id, alice_rule.id]


async def test_delete_own_rules_and_admin_chat_rules(store):
    alice_rule, _ = await store.add(A_P2P, "Call me Ali")
    bob_rule, _ = await store.add(B_P2P, "No emoji for Bob")
    chat_rule, _ = await store.add(ADMIN_GROUP, "Answer in English in this chat", chat_scope=True)

    assert await store.delete(B_GROUP, alice_rule.id) is False        # someone else's rule
    assert [p.id for p in await store.list("ou_alice")] == [alice_rule.id]
    with pytest.raises(PermissionError):
        await store.delete(A_GROUP, chat_rule.id)                     # chat rule, not admin
    assert await store.delete(ADMIN_OTHER, chat_rule.id) is False     # another chat's rule
    assert await store.delete(ADMIN_GROUP, bob_rule.id) is False      # admins don't own user rules
    assert await store.delete(ADMIN_GROUP, chat_rule.id) is True
    assert await store.delete(A_GROUP, alice_rule.id) is True
    assert await store.delete(A_GROUP, alice_rule.id) is False
    assert [p.id for p in await store.list("ou_bob")] == [bob_rule.id]


async def test_delete_all_removes_only_the_users_own_rules(store):
    await store.add(A_P2P, "Call me Ali")
    await store.add(A_GROUP, "Keep it short")
    admin_own, _ = await store.add(ADMIN_GROUP, "Reply in English to me")
    chat_rule, _ = await store.add(ADMIN_GROUP, "Answer in English in this chat", chat_scope=True)
    bob_rule, _ = await store.add(B_P2P, "No emoji for Bob")
    assert await store.delete_all("ou_alice") == 2
    assert await store.list("ou_alice") == []
    assert await store.delete_all("ou_admin") == 1
    assert [p.id for p in await store.for_request(B_GROUP)] == [chat_rule.id, bob_rule.id]


@pytest.mark.parametrize(
    "rule, match",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("。！", "empty"),
        ("Reply in English.\nAnd be brief.", "single line"),
        ("x" * (MAX_RULE_CHARS + 1), "too long"),
        ("Use the API key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123 for tests", "password, key or token"),
    ],
)
async def test_bad_rules_are_refused_with_a_clear_message(store, rule, match):
    with pytest.raises(ValueError, match=match):
        await store.add(A_P2P, rule)
    assert await store.list("ou_alice") == []


async def test_rule_of_exactly_the_limit_is_accepted(store):
    p, created = await store.add(A_P2P, "y" * MAX_RULE_CHARS)
    assert created and len(p.rule) == MAX_RULE_CHARS


async def test_rules_per_scope_are_capped(db):
    store = ProcedureStore(db, max_rules=2)
    await store.add(A_P2P, "Call me Ali")
    await store.add(A_P2P, "Keep it short")
    with pytest.raises(ValueError, match="at most 2"):
        await store.add(A_P2P, "No emoji please")
    assert (await store.add(A_P2P, "keep it short."))[1] is False   # a duplicate is still fine
    assert (await store.add(B_P2P, "No emoji please"))[1] is True     # per scope
