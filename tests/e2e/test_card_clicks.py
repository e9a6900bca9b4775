"""Confirm-card clicks at the wire (issue 25, issue 32 Low): ``ethan serve`` as a subprocess on
both transports — the signed, encrypted webhook, and the real lark-oapi long connection against
tests/fakes/fake_lark_ws.py, where a click arrives in a ``type=event`` frame as on Lark's — is
answered within Lark's 3 s with a toast, and the updated card, in the callback's own response
(the HTTP body; the response frame's base64 ``data``).

- another user's click: "only the person asked can confirm", nothing erased, the card as it was;
- the asker's click: a toast, the card without buttons in the response; the command runs and
  the card shows its answer;
- a second click: "already done", nothing runs again;
- a click on a card the bot did not send (not in the confirm-card ledger): refused, nothing runs,
  whatever the button's value says;
- a click after ``ETHAN_CONFIRM_CARD_MINUTES``: "expired", an expired card, nothing runs.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, running_model
from tests.fakes.fake_lark import FakeLark
from tests.fakes.fake_lark_ws import FakeLarkWs
from tests.fakes.lark_events import make_card_action_event, make_text_event, webhook_request
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN
from tests.reliability.support import ServerProcess, post_event, sqlite_rows, wait_until

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


@pytest.fixture(params=["webhook", "ws"])
def transport(request):
    return request.param


@pytest.fixture
def lark():
    fake = FakeLark().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def ws(lark, transport):
    if transport != "ws":
        yield None
        return
    fake = FakeLarkWs(lark).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def model():
    with running_model() as fake:
        yield fake


@pytest.fixture
def serve(tmp_path, lark, ws, model, transport):
    made: list[ServerProcess] = []

    async def start(**env) -> ServerProcess:
        srv = ServerProcess(tmp_path / "home", lark, model, lark_transport=transport, **env)
        made.append(srv)
        await srv.start_ready()
        if ws is not None:
            await asyncio.to_thread(ws.wait_connected)
        return srv

    yield start
    for srv in made:
        srv.close()


async def send(srv, ws, event: dict) -> None:
    if ws is None:
        async with aiohttp.ClientSession() as http:
            assert await post_event(http, srv.url, event) == 200
    else:
        await ws.wait_connected_async()         # the client may be between connections (a reconnect)
        mid = await asyncio.to_thread(ws.push, event)
        assert (await ws.wait_ack_async(mid)).code == 200


async def click(srv, ws, event: dict) -> tuple[float, dict | None]:
    """One click as Lark delivers it: (seconds to the answer, the body Lark would show)."""
    t0 = time.monotonic()
    if ws is None:
        headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
        async with aiohttp.ClientSession() as http:
            async with http.post(srv.url + "/lark/events", data=body, headers=headers,
                                 timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 200
                got = await r.json()
        took = time.monotonic() - t0
        return took, (got if "toast" in got else None)
    # The client may be between connections (its watchdog reconnects a connection whose pong
    # came late under load): Lark delivers on the next one, and so does this.
    await ws.wait_connected_async()
    mid = await asyncio.to_thread(ws.push, event)          # a type=event frame, as on Lark's
    ack = await ws.wait_ack_async(mid)
    assert ack.code == 200
    return ack.seconds, ack.data


def facts(srv) -> int:
    return sqlite_rows(srv.db_path, "SELECT count(*) AS n FROM facts")[0]["n"]


async def confirm_card(srv, ws, lark, model):
    """Alice has a fact, then asks to forget everything: the confirm card."""
    model.script(ToolUse("memory_write", {"content": "Alice 喜欢乌龙茶", "category": "preference"}),
                 Text("记住了。"))
    await send(srv, ws, make_text_event("记住：我喜欢乌龙茶", **ALICE))
    await lark.wait_for_messages_async(1, timeout=20)
    await wait_until(lambda: facts(srv) == 1, 10, "the fact stored")
    await send(srv, ws, make_text_event("/forget all", **ALICE))
    [_, card] = await lark.wait_for_messages_async(2, timeout=20)
    assert card.msg_type == "interactive"
    await wait_until(lambda: sqlite_rows(srv.db_path, "SELECT 1 FROM card_confirmations WHERE card_message_id = ?",
                                         (card.message_id,)), 10, "the card in the ledger")
    return card


VALUE = {"ethan": "confirm", "cmd": "/forget all confirm", "user": "ou_alice", "chat_type": "p2p"}


def toast_text(body: dict | None) -> str:
    assert body is not None and "toast" in body, body
    return json.dumps(body["toast"], ensure_ascii=False)


async def test_another_users_click_gets_a_toast_in_time_and_erases_nothing(serve, ws, lark, model):
    srv = await serve()
    card = await confirm_card(srv, ws, lark, model)

    # Bob clicks Alice's confirm button.
    took, body = await click(srv, ws, make_card_action_event(VALUE, chat_id="oc_p2p_alice",
                                                             message_id=card.message_id, operator="ou_bob"))
    assert took < 3.0, f"answered after {took:.2f}s: Lark shows nothing past 3 s"
    assert "Only the person asked can confirm" in toast_text(body) and "只有提问的人可以确认" in toast_text(body)
    assert "card" not in body                                    # Alice's card stays as it was
    await asyncio.sleep(0.5)
    assert facts(srv) == 1 and lark.message(card.message_id).edits == 0
    assert [e for e in srv.entries() if e.get("event") == "card.refused"][0]["reason"] == "click by another user"

    # A click on a card the bot never sent, with a value claiming to be Alice's confirm.
    took, body = await click(srv, ws, make_card_action_event(VALUE, chat_id="oc_p2p_alice", message_id="om_forged"))
    assert took < 3.0 and "Not a confirmation card I sent" in toast_text(body)
    await asyncio.sleep(0.5)
    assert facts(srv) == 1

    # Alice's own click: a toast and the card without buttons, at once; then the erase.
    took, body = await click(srv, ws, make_card_action_event(VALUE, chat_id="oc_p2p_alice", message_id=card.message_id))
    assert took < 3.0 and "Confirmed" in toast_text(body)
    shown = json.dumps(body["card"], ensure_ascii=False)
    assert body["card"]["type"] == "raw" and "button" not in shown and "已确认" in shown
    await wait_until(lambda: facts(srv) == 0, 10, "the erase")
    await wait_until(lambda: lark.message(card.message_id).edits == 1, 10, "the card showing the outcome")
    assert "已执行" in json.dumps(lark.message(card.message_id).current_content, ensure_ascii=False)

    # A second click: already done, nothing runs again.
    model.script(ToolUse("memory_write", {"content": "Alice 喜欢红茶", "category": "preference"}), Text("好。"))
    await send(srv, ws, make_text_event("记住：我喜欢红茶", **ALICE))
    await wait_until(lambda: facts(srv) == 1, 20, "a new fact")
    took, body = await click(srv, ws, make_card_action_event(VALUE, chat_id="oc_p2p_alice", message_id=card.message_id))
    assert took < 3.0 and "Already done" in toast_text(body)
    await asyncio.sleep(0.5)
    assert facts(srv) == 1 and lark.message(card.message_id).edits == 1
    statuses = sqlite_rows(srv.db_path, "SELECT status, note FROM inbox WHERE event_type = 'card.action.trigger'"
                                        " ORDER BY id")
    assert [(r["status"], r["note"]) for r in statuses] == [
        ("ignored", "click by another user"), ("ignored", "not a card Ethan sent"),
        ("done", "confirmed"), ("ignored", "card already decided")]
    assert not [e for e in srv.entries() if e.get("level") == "error"]


async def test_a_click_after_the_cards_time_is_refused_as_expired(serve, ws, lark, model):
    srv = await serve(ethan_confirm_card_minutes="0.02")          # 1.2 s
    card = await confirm_card(srv, ws, lark, model)
    await asyncio.sleep(1.5)
    took, body = await click(srv, ws, make_card_action_event(VALUE, chat_id="oc_p2p_alice", message_id=card.message_id))
    assert took < 3.0 and "expired" in toast_text(body)
    assert "已过期" in json.dumps(body["card"], ensure_ascii=False)
    await asyncio.sleep(0.5)
    assert facts(srv) == 1 and lark.message(card.message_id).edits == 0
