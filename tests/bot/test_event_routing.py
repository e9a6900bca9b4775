"""A Lark event is decoded once and routed by the registry (issue 28).

- The registry (bot/lark/events.py ``REGISTRY``: event type → spec) and the core's handler table
  (bot/core/lifecycle.py ``HANDLERS``: neutral event → what is done) match: every registered event
  type becomes an event something handles, every handler has an event type that makes it.
- Each type's translation makes the neutral event its spec declares.
- The intake hands the decoded event on with the inbox row, so the handler's decode does not
  parse the payload again; a row read back from the database decodes to the same event.
- One module parses an event's JSON (read from the source).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from bot.core import lifecycle
from bot.delivery.dispatcher import Dispatcher
from bot.core.inbound import Inbound
from bot.lark import events
from bot.lark.intake import Intake
from bot.lark.lifecycle import LarkDecoder
from bot.delivery.inbox_store import Inbox
from storage.sqlite import SqliteDatabase
from tests.fakes import lark_events as le

ROOT = Path(__file__).resolve().parents[2]


def _samples() -> dict[str, dict]:
    return {
        events.MESSAGE_RECEIVE: le.make_text_event("hello", chat_id="oc_p2p", message_id="om_1"),
        events.MESSAGE_RECALLED: le.make_recalled_event("om_1", chat_id="oc_p2p"),
        events.BOT_ADDED: le.make_bot_added_event("oc_g"),
        events.BOT_DELETED: le.make_bot_added_event("oc_g", deleted=True),
        events.CHAT_DISBANDED: le._envelope(events.CHAT_DISBANDED, {
            "chat_id": "oc_g", "operator_id": le._user_id("ou_alice"), "name": "Team"}),
        events.P2P_ENTERED: le.make_p2p_entered_event("oc_p2p"),
        events.CARD_ACTION: le.make_card_action_event(
            {"ethan": "confirm", "user": "ou_alice", "cmd": "/forget all", "chat_type": "p2p"},
            chat_id="oc_p2p", message_id="om_card"),
    }


def test_every_registered_event_type_has_a_handler_and_every_handler_an_event_type():
    made = {spec.event for spec in events.REGISTRY.values()}
    handled = set(lifecycle.HANDLERS) | {Inbound}          # a message is the handler's own path
    assert made - handled == set(), f"registered, nobody handles: {made - handled}"
    assert handled - made == set(), f"handled, no event type makes it: {handled - made}"
    for spec in events.REGISTRY.values():
        assert spec.event_type and spec.model and spec.route and spec.translate


def test_the_samples_cover_the_registry():
    assert set(_samples()) == set(events.REGISTRY)


@pytest.mark.parametrize("event_type", sorted(events.REGISTRY))
def test_each_type_decodes_once_into_the_event_its_spec_declares(event_type):
    body = _samples()[event_type]
    decoded = events.decode(json.dumps(body))
    assert decoded is not None and decoded.spec is events.REGISTRY[event_type]
    event = decoded.translate("ou_bot")
    assert type(event) is decoded.spec.event
    assert event == events.decode(body).translate("ou_bot")   # the stored text or the verified dict: one decode


def test_a_click_becomes_the_core_s_button_event():
    ev = events.decode(_samples()[events.CARD_ACTION]).translate()
    assert ev == lifecycle.ButtonClicked(card_message_id="om_card", chat_id="oc_p2p", clicker="ou_alice",
                                         button="confirm", asked_by="ou_alice", command="/forget all",
                                         chat_type="p2p")
    foreign = le.make_card_action_event({"other_app": 1}, chat_id="oc_p2p", message_id="om_x")
    assert events.decode(foreign).translate().button == ""       # not Ethan's: the core ignores it


async def test_the_intake_hands_on_the_decoded_event_and_a_stored_row_decodes_the_same(tmp_path):
    db = await SqliteDatabase(tmp_path / "ethan.db").open()
    try:
        jobs: list = []

        async def handler(job) -> None:
            jobs.append(job)

        dispatcher = Dispatcher(handler)
        inbox = Inbox(db)
        intake = Intake(inbox, dispatcher)
        body = le.make_text_event("你好 @_user_1", chat_id="oc_g", chat_type="group", message_id="om_7",
                                  mentions=[le.mention("ou_bot", "Ethan", key="@_user_1")])
        assert (await intake.accept(json.dumps(body, ensure_ascii=False), body)).status == "accepted"
        await dispatcher.stop(5)
        [item] = jobs
        assert isinstance(item.event, events.LarkEvent) and item.event.header.event_id == body["header"]["event_id"]

        async def bot_id() -> str:
            return "ou_bot"

        decode = LarkDecoder(bot_id)
        fresh = await decode(item)
        [stored] = await inbox.pending()
        assert stored.event is None                     # read back: decoded when handled
        again = await decode(stored)
        assert isinstance(fresh, Inbound) and fresh == again
        assert fresh.text == "你好" and fresh.mentions_bot and fresh.chat_id == "oc_g"
    finally:
        await db.close()


def _calls(path: Path) -> list[tuple[int, str]]:
    """Calls that parse an event: ``Envelope.model_validate`` and ``json.loads(<…>.payload)``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if f.attr == "model_validate" and isinstance(f.value, ast.Name) and f.value.id == "Envelope":
            out.append((node.lineno, "Envelope.model_validate"))
        if (f.attr == "loads" and node.args and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr == "payload"):
            out.append((node.lineno, "json.loads(….payload)"))
    return out


def test_one_module_parses_an_event():
    """bot/lark/events.py ``decode`` (and the intake's envelope check, before it stores) — no
    other module parses an event's JSON or a stored payload."""
    allowed = {"bot/lark/events.py", "bot/lark/intake.py"}
    found = {}
    for path in sorted((ROOT / "bot").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        calls = _calls(path)
        if calls and rel not in allowed:
            found[rel] = calls
    assert not found, f"an event parsed outside bot/lark/events.py: {found}"
