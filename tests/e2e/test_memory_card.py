"""Memory the user governs in Lark (issue 31 ★), at the wire: ``/memory`` answers with a card
listing what Ethan knows about the user — facts, profile lines, rules — each with where and
when it was learned, and Forget / Correct buttons. Signed, encrypted webhook events (messages
and card callbacks) through the app; the card, its updates and the model's requests read back
from the fakes; both backends.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.fake_anthropic import Text, ToolUse
from tests.fakes.lark_events import make_card_action_event
from tests.harness import Harness

pytestmark = pytest.mark.app_backends

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


async def _post(h, event) -> None:
    status, body = await h.post(event)
    assert status == 200, (status, body)
    await h.idle()


def _card(h, mid) -> str:
    return json.dumps(h.lark.message(mid).current_content, ensure_ascii=False)


def _buttons(card: dict) -> list[dict]:
    out = []

    def walk(x):
        if isinstance(x, dict):
            if x.get("tag") == "button":
                out.append(x["behaviors"][0]["value"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(card)
    return out


def _button(card: dict, op: str, kind: str, item_id: int) -> dict:
    [v] = [b for b in _buttons(card) if b.get("op") == op and b.get("kind") == kind and b.get("id") == item_id]
    return v


async def _facts(h) -> list[dict]:
    return [dict(r) for r in await h.app.db.fetchall(
        "SELECT id, content, source, superseded_at, superseded_by FROM facts ORDER BY id")]


async def test_memory_card_forgets_and_corrects_only_for_its_owner(tmp_path):
    async with Harness(tmp_path) as h:
        # Alice teaches a fact, a profile line and a rule in her direct chat (the model's tools).
        h.model.script(ToolUse("memory_write", {"content": "用户喜欢喝乌龙茶", "category": "preference"}),
                       ToolUse("profile_update", {"section": "身份与背景", "entry": "在杭州做后端开发"}),
                       ToolUse("procedure_write", {"rule": "回答尽量简短", "context": "用户要求"}),
                       Text("记住了。"))
        taught = await h.send_text("记住：我喜欢喝乌龙茶，我在杭州做后端开发，回答简短点", **ALICE)
        await h.replies(1)
        await h.idle()
        [fact] = await _facts(h)
        taught_mid = taught["event"]["message"]["message_id"]

        await h.send_text("/memory", **ALICE)
        card_msg = (await h.replies(2))[-1]
        await h.idle()
        assert card_msg.msg_type == "interactive"
        card = card_msg.content
        shown = json.dumps(card, ensure_ascii=False)
        # each item with where and when it was learned
        assert "用户喜欢喝乌龙茶" in shown and "在杭州做后端开发" in shown and "回答尽量简短" in shown
        assert "本对话" in shown and taught_mid[-6:] in shown, shown
        forget = _button(card, "forget", "fact", fact["id"])
        correct = _button(card, "correct", "fact", fact["id"])
        assert forget["user"] == "ou_alice" and {b["kind"] for b in _buttons(card) if "kind" in b} == \
            {"fact", "profile", "rule"}
        mid = card_msg.message_id

        # Bob's clicks change nothing: no forget, no correction, the card untouched (Bob has
        # memory of his own: a click taken for his would redraw Alice's card with his)
        from memory.scope import Scope
        await h.app.memory.facts.add(Scope(user_id="ou_bob", chat_id="oc_p2p_bob", chat_type="p2p"),
                                     "用户是 Bob", "knowledge", source="user_edit")
        fact = (await _facts(h))[0]
        # ... and gets a toast in the callback's own response (Lark shows it within 3 s)
        status, body = await h.post(make_card_action_event(forget, chat_id="oc_p2p_alice", message_id=mid,
                                                           operator="ou_bob"))
        await h.idle()
        assert status == 200 and "只有这张卡片的主人可以操作" in json.dumps(json.loads(body)["toast"], ensure_ascii=False)
        save = {**correct, "op": "save"}
        await _post(h, make_card_action_event(save, chat_id="oc_p2p_alice", message_id=mid, operator="ou_bob",
                                              form_value={"text": "用户喜欢喝可乐"}, name="save_fact_1"))
        assert (await _facts(h))[0] == fact and h.lark.message(mid).edits == 0
        refused = await h.app.db.fetchall("SELECT actor FROM audit WHERE action = 'card.memory' AND allowed = 0")
        assert [r["actor"] for r in refused] == ["ou_bob", "ou_bob"]

        # Alice's Correct opens the edit form with the current text; Save supersedes with history
        status, body = await h.post(make_card_action_event(correct, chat_id="oc_p2p_alice", message_id=mid))
        await h.idle()
        assert status == 200 and json.loads(body)["toast"]["type"] == "info"
        edit = h.lark.message(mid).current_content
        assert '"tag": "form"' in json.dumps(edit) and '"default_value": "用户喜欢喝乌龙茶"' in _card(h, mid)
        save = _button(edit, "save", "fact", fact["id"])
        await _post(h, make_card_action_event(save, chat_id="oc_p2p_alice", message_id=mid,
                                              form_value={"text": "用户喜欢喝红茶，不再喝乌龙茶"}, name="save_fact_1"))
        old, _bob, new = await _facts(h)
        assert old["id"] == fact["id"] and old["superseded_by"] == new["id"] and old["superseded_at"] is not None
        assert new["content"] == "用户喜欢喝红茶，不再喝乌龙茶" and new["source"] == "user_edit"
        after = _card(h, mid)
        assert "用户喜欢喝红茶" in after and "已更正" in after and "用户喜欢喝乌龙茶" not in after

        # the next answer sees the corrected fact, not the old one
        await h.send_text("我喜欢喝什么？", **ALICE)
        await h.replies(3)
        await h.idle()
        req = json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)
        assert "用户喜欢喝红茶" in req and "用户喜欢喝乌龙茶" not in req

        # Forget: the fact, and the profile line, gone from the card and from the next request
        card = h.lark.message(mid).current_content
        await _post(h, make_card_action_event(_button(card, "forget", "fact", new["id"]),
                                              chat_id="oc_p2p_alice", message_id=mid))
        entry = await h.app.db.fetchone("SELECT id FROM profile_entries")
        card = h.lark.message(mid).current_content
        await _post(h, make_card_action_event(_button(card, "forget", "profile", entry["id"]),
                                              chat_id="oc_p2p_alice", message_id=mid))
        assert [f["content"] for f in await _facts(h) if f["superseded_at"] is None] == ["用户是 Bob"]
        assert await h.app.db.fetchone("SELECT id FROM profile_entries") is None
        final = h.lark.message(mid).current_content
        assert {b["kind"] for b in _buttons(final) if "kind" in b} == {"rule"}       # only the rule is left
        assert "已删除画像条目" in json.dumps(final, ensure_ascii=False) and "红茶" not in json.dumps(final, ensure_ascii=False)
        await h.send_text("我喜欢喝什么？我在哪？", **ALICE)
        await h.replies(4)
        await h.idle()
        req = json.dumps(h.model.chat_requests()[-1].json["system"], ensure_ascii=False)
        assert "红茶" not in req and "在杭州做后端开发" not in req


async def test_memory_in_the_console_is_text_with_provenance_and_typed_commands(tmp_path):
    """Transports without cards keep the text answer; /correct and /forget profile typed work."""
    async with Harness(tmp_path) as h:
        from memory.scope import Scope
        scope = Scope(user_id="ou_alice", chat_id="oc_p2p_alice", chat_type="p2p", message_id="om_taught_x1")
        w = await h.app.memory.facts.add(scope, "用户住在杭州", "knowledge", source="agent_proactive")
        async with h.http.post(h.url + "/chat", json={"user_id": "ou_alice", "text": "/memory"}) as r:
            body = await r.json()
        assert f"#{w.fact.id} " in body["reply"] and "用户住在杭州" in body["reply"] and "direct chat message …ght_x1" in body["reply"]
        async with h.http.post(h.url + "/chat", json={"user_id": "ou_alice",
                                                     "text": f"/correct {w.fact.id} 用户住在上海"}) as r:
            assert "已更正" in (await r.json())["reply"] or "Corrected" in (await r.json())["reply"]
        facts = await _facts(h)
        assert [f["content"] for f in facts if f["superseded_at"] is None] == ["用户住在上海"] and len(facts) == 2


async def test_a_forged_memory_card_click_changes_nothing_and_shows_no_private_view(tmp_path):
    """Issue 45 N11: the button's value named the owner and the chat type, and the click was
    taken at its word. Owner and chat type now come from the card ledger (the card Ethan sent):
    a value saying ``p2p`` on a group's card, a click whose value names another user on Alice's
    card, and a click on a card Ethan never sent change nothing and show no private view."""
    async with Harness(tmp_path) as h:
        from memory.scope import Scope
        facts = h.app.memory.facts
        private = (await facts.add(Scope(user_id="ou_alice", chat_id="oc_p2p_alice", chat_type="p2p"),
                                   "用户的月薪是五万", "knowledge", source="agent_proactive")).fact
        shared = (await facts.add(Scope(user_id="ou_alice", chat_id="oc_team_mem", chat_type="group"),
                                  "用户负责支付模块", "knowledge", source="user_edit")).fact
        await facts.add(Scope(user_id="ou_bob", chat_id="oc_p2p_bob", chat_type="p2p"),
                        "用户上周请了病假", "knowledge", source="agent_proactive")
        before = await _facts(h)

        await h.send_text("/memory", chat_id="oc_team_mem", chat_type="group")
        card_msg = (await h.replies(1))[-1]
        await h.idle()
        mid, card = card_msg.message_id, card_msg.content
        shown = json.dumps(card, ensure_ascii=False)
        assert "用户负责支付模块" in shown and "月薪" not in shown          # the group's view
        genuine = _button(card, "forget", "fact", shared.id)
        assert (genuine["user"], genuine["chat_type"]) == ("ou_alice", "group")
        alice_msg = (await h.send_text("你好", chat_id="oc_p2p_alice"))["event"]["message"]["message_id"]
        await h.replies(2)
        await h.idle()

        forged = [
            # the owner's click, its value saying p2p: forget the private fact, redraw the private view
            (dict(genuine, id=private.id, chat_type="p2p"), "ou_alice", "oc_team_mem", mid),
            (dict(genuine, op="back", chat_type="p2p"), "ou_alice", "oc_team_mem", mid),
            # Bob's click, its value naming Bob: his own private view drawn on Alice's card
            ({"ethan": "memory", "op": "back", "user": "ou_bob", "chat_type": "p2p"}, "ou_bob", "oc_team_mem", mid),
            # a message Ethan never sent as a /memory card (Alice's own): a forget from nowhere
            (dict(genuine, id=private.id, chat_type="p2p"), "ou_alice", "oc_p2p_alice", alice_msg),
        ]
        for value, operator, chat, card_mid in forged:
            status, body = await h.post(make_card_action_event(value, chat_id=chat, message_id=card_mid,
                                                               operator=operator))
            await h.idle()
            assert status == 200 and json.loads(body)["toast"]["type"] == "warning", body
        assert await _facts(h) == before
        assert h.lark.message(mid).edits == 0
        everything = json.dumps([m.current_content for m in h.lark.messages()], ensure_ascii=False)
        assert "月薪" not in everything and "病假" not in everything
        refused = await h.app.db.fetchall(
            "SELECT actor, detail FROM audit WHERE action = 'card.memory' AND allowed = 0 ORDER BY id")
        assert [(r["actor"], r["detail"]) for r in refused] == [
            ("ou_alice", "button value disagrees with the card"), ("ou_alice", "button value disagrees with the card"),
            ("ou_bob", "click by another user"), ("ou_alice", "not a /memory card Ethan sent")]

        # the card's own button still acts, in the group's view
        status, body = await h.post(make_card_action_event({**genuine, "op": "back"}, chat_id="oc_team_mem",
                                                           message_id=mid))
        await h.idle()
        assert status == 200 and json.loads(body)["toast"]["type"] == "info"
        assert h.lark.message(mid).edits == 1 and "月薪" not in _card(h, mid) and "用户负责支付模块" in _card(h, mid)
