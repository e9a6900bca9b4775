"""The long connection at the wire: ``ethan serve`` (a subprocess, ``LARK_TRANSPORT=ws``) runs
the real ``lark_oapi.ws.Client`` against the fake long-connection server
(tests/fakes/fake_lark_ws.py), which it discovers at ``LARK_DOMAIN`` like the real one.

- an event pushed as a DATA frame is committed to the inbox before its response frame
  (code 200) goes back, in well under Lark's 3 s even while the model takes 10 s, and is
  answered through the reply API;
- a duplicate push gives one reply; a fragmented event (sum/seq) is answered once;
- the client pings; after the server drops the connection it reconnects (per the server's
  ClientConfig: count, interval, nonce) and the next event is answered; once ReconnectCount is
  used up, or credentials are refused, it backs off and keeps trying (never gives up); a
  connection that goes silent (no pong, no frame) is made again by the watchdog; ``/healthz``
  is ready only while connected and says why not (also for an unreachable domain, refused
  credentials, a discovery that hangs — which blocks nothing);
- SIGTERM closes the connection and exits 0 within the deadline, no traceback, even while
  discovery hangs; a second SIGTERM ends a stop that is still waiting;
- in process: a store failure is answered 500 (Lark redelivers); two connections in one
  process each deliver (nothing process-wide).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from bot.lark.transport.ws import LongConnection
from tests.fakes.fake_anthropic import Delay, Text, last_user_text, running_model
from tests.fakes.fake_lark import FakeLark
from tests.fakes.fake_lark_ws import FakeLarkWs
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness
from tests.reliability.support import (ServerProcess, deliveries_by_trigger, free_port, sqlite_rows,
                                       wait_until)

DEADLINE = 8.0
# The long connection on the application's loop (the default) and on a thread of its own
# (ETHAN_WS_OWN_THREAD=true): the central tests run on both.
LAYOUTS = ["false", "true"]


@pytest.fixture
def lark():
    fake = FakeLark().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def ws(lark):
    fake = FakeLarkWs(lark).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def model():
    with running_model(lambda req: Text(f"echo: {last_user_text(req)}")) as fake:
        yield fake


@pytest.fixture
def server(tmp_path, lark, ws, model):
    made: list[ServerProcess] = []

    def make(**env) -> ServerProcess:
        env = {"lark_transport": "ws", "ethan_shutdown_deadline": str(DEADLINE), **env}
        srv = ServerProcess(tmp_path / f"home{len(made)}", lark, model, **env)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


async def healthz(srv: ServerProcess) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(srv.url + "/healthz", timeout=aiohttp.ClientTimeout(total=3)) as r:
            return r.status, await r.json()


async def wait_health(srv: ServerProcess, status: int, timeout: float = 20.0) -> dict:
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = await healthz(srv)
            if last[0] == status:
                return last[1]
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"/healthz never answered {status} within {timeout}s (last: {last})\n{srv.tail()}")


def events(srv: ServerProcess, name: str) -> list[dict]:
    return [e for e in srv.entries() if e.get("event") == name]


def no_tracebacks(srv: ServerProcess) -> None:
    text = "\n".join(srv.lines())
    assert "Traceback" not in text, srv.tail(60)
    assert srv.errors() == [], srv.errors()


# ------------------------------------------------------------------------------------------
# ethan serve on the long connection
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_p2p_text_is_stored_then_acknowledged_fast_and_answered_later(layout, server, ws, lark, model):
    model.responder = lambda req: Delay(10, Text(f"slow echo: {last_user_text(req)}"))
    srv = server(ethan_ws_own_thread=layout)
    await srv.start_ready()
    ev = make_text_event("hello over the long connection", chat_id="oc_p2p_alice")
    mid = await asyncio.to_thread(ws.push, ev)
    ack = await ws.wait_ack_async(mid)
    assert ack.code == 200
    assert ack.seconds < 3.0, f"response frame after {ack.seconds:.2f}s: Lark would redeliver"
    # Acknowledged means stored: the row is there the moment the response frame is.
    rows = sqlite_rows(srv.db_path, "SELECT status FROM inbox WHERE event_id = ?", (ev["header"]["event_id"],))
    assert len(rows) == 1
    assert ack.headers.get("biz_rt") is not None
    [reply] = await lark.wait_for_messages_async(1, timeout=30)
    assert reply.kind == "reply" and reply.reply_to == ev["event"]["message"]["message_id"]
    assert reply.text == "slow echo: hello over the long connection"
    assert ws.pings >= 1                          # the SDK's ping frames flow
    assert len(events(srv, "ws.connected")) == 1
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_duplicate_push_and_fragmented_event_are_answered_once(layout, server, ws, lark):
    srv = server(ethan_ws_own_thread=layout)
    await srv.start_ready()
    ev = make_text_event("twice", chat_id="oc_p2p_alice")
    first = await asyncio.to_thread(ws.push, ev)
    second = await asyncio.to_thread(ws.push, ev)             # Lark's redelivery: a new frame
    assert (await ws.wait_ack_async(first)).code == 200
    assert (await ws.wait_ack_async(second)).code == 200
    frag_ev = make_text_event("in three pieces " + "长" * 400, chat_id="oc_p2p_bob", sender="ou_bob")
    frag = await asyncio.to_thread(ws.push, frag_ev, fragments=3)
    assert (await ws.wait_ack_async(frag)).code == 200
    await lark.wait_for_messages_async(2, timeout=20)
    await wait_until(lambda: events(srv, "event.duplicate"), 10, "the duplicate to be noticed")
    await asyncio.sleep(0.5)                                  # a second reply would be out by now
    by_trigger = deliveries_by_trigger(lark)
    assert by_trigger[ev["event"]["message"]["message_id"]] == 1
    assert by_trigger[frag_ev["event"]["message"]["message_id"]] == 1
    assert len(ws.acks(frag)) == 1                            # only the completed event is answered
    [frag_reply] = [m for m in lark.messages() if m.reply_to == frag_ev["event"]["message"]["message_id"]]
    assert frag_reply.text.startswith("echo: in three pieces 长长")
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["close", "reset"])
async def test_reconnects_after_the_server_drops_the_connection(layout, server, ws, lark, mode):
    srv = server(ethan_ws_own_thread=layout)
    await srv.start_ready()
    assert await asyncio.to_thread(ws.drop, mode=mode) == 1
    await asyncio.to_thread(ws.wait_connections_total, 2)
    await wait_health(srv, 200)
    ev = make_text_event("after the drop", chat_id="oc_p2p_alice")
    mid = await asyncio.to_thread(ws.push, ev)
    assert (await ws.wait_ack_async(mid)).code == 200
    [reply] = await lark.wait_for_messages_async(1, timeout=20)
    assert reply.text == "echo: after the drop"
    [lost] = events(srv, "ws.disconnected")
    assert lost["reason"]                                     # says why
    assert len(events(srv, "ws.connected")) == 2
    assert len(ws.discoveries) == 2                           # the endpoint is asked again
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_healthz_follows_the_connection(server, ws):
    srv = server()
    await srv.start_ready()
    _, body = await healthz(srv)
    assert body["transport"]["kind"] == "ws" and body["transport"]["state"] == "connected"
    ws.refuse_connections = True                              # handshakes answered 503
    await asyncio.to_thread(ws.drop)
    body = await wait_health(srv, 503)
    assert body["ready"] is False and body["transport"]["state"] in ("disconnected", "connecting")
    assert body["reason"].startswith("ws ")
    await wait_until(lambda: any("503" in e.get("reason", "") for e in events(srv, "ws.disconnected")),
                     15, "a refused handshake to be logged with its reason")
    ws.refuse_connections = False
    body = await wait_health(srv, 200)
    assert body["ready"] is True and body["reason"] == ""
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_slow_endpoint_discovery_does_not_block_the_app(server, ws, lark):
    lark.stall_next("/callback/ws/endpoint", 6)               # the SDK's blocking POST hangs
    srv = server()
    srv.start()
    await wait_until(lambda: lark.calls_to("/callback/ws/endpoint"), 30, "the endpoint discovery")
    status, body = await healthz(srv)                          # answered meanwhile (3 s timeout)
    assert status == 503 and body["transport"]["state"] == "connecting"
    body = await wait_health(srv, 200)
    assert body["transport"]["connects"] == 1
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_sigterm_while_endpoint_discovery_hangs(server, lark):
    lark.stall_next("/callback/ws/endpoint", 60)
    srv = server()
    srv.start()
    await wait_until(lambda: lark.calls_to("/callback/ws/endpoint"), 30, "the endpoint discovery")
    await wait_until(lambda: events(srv, "app.ready"), 30, "the app to be up")
    code, elapsed = await srv.terminate()
    assert code == 0 and elapsed < DEADLINE
    assert events(srv, "ws.stopped") and not events(srv, "ws.stop_timeout")
    no_tracebacks(srv)


async def test_reconnects_as_the_server_config_says_then_backs_off_and_comes_back(server, ws, lark):
    """Lark's ReconnectCount used up is not the end (issue 32 item 8): the client backs off,
    discovering the endpoint on every try, /healthz 503 meanwhile, one line per state change."""
    ws.client_config = {"ReconnectCount": 2, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 2}
    srv = server(ethan_ws_retry_max_s="1")
    await srv.start_ready()
    [up] = events(srv, "ws.connected")
    assert up["reconnect_count"] == 2 and up["ping_interval_s"] == 2     # the server's ClientConfig
    ws.refuse_connections = True
    await asyncio.to_thread(ws.drop)
    await wait_until(lambda: events(srv, "ws.backing_off"), 20, "the client to back off")
    [off] = events(srv, "ws.backing_off")
    assert "2 reconnect attempts" in off["cause"] and "503" in off["reason"]
    discovered = len(ws.discoveries)
    await wait_until(lambda: len(ws.discoveries) >= discovered + 3, 20, "three more tries while backing off")
    status, body = await healthz(srv)
    assert status == 503 and body["transport"]["state"] == "backing_off"
    assert body["reason"].startswith("ws backing_off: ") and "503" in body["reason"]
    assert body["transport"]["attempts"] >= 2 + 3
    assert len(events(srv, "ws.backing_off")) == 1            # tries failing alike: no more lines
    ws.refuse_connections = False
    await wait_health(srv, 200)
    assert [e["event"] for e in srv.entries() if e.get("event", "").startswith("ws.")
            and e["event"] not in ("ws.ping_failed",)] == [
        "ws.connecting", "ws.connected", "ws.disconnected", "ws.disconnected", "ws.backing_off", "ws.connected"]
    mid = await asyncio.to_thread(ws.push, make_text_event("back again", chat_id="oc_p2p_alice"))
    assert (await ws.wait_ack_async(mid)).code == 200
    [reply] = await lark.wait_for_messages_async(1, timeout=20)
    assert reply.text == "echo: back again"
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_refused_credentials_back_off_until_they_are_accepted(server, ws, lark):
    ws.app_secret = "the-real-secret"                                     # ethan sends another
    srv = server(ethan_ws_retry_max_s="1")
    srv.start()
    await wait_until(lambda: events(srv, "ws.backing_off"), 30, "the client to back off")
    [line] = events(srv, "ws.backing_off")
    assert "refused by the server" in line["reason"] and "app secret invalid" in line["reason"]
    await wait_until(lambda: len(ws.discoveries) >= 4, 20, "the endpoint asked again and again")
    status, body = await healthz(srv)
    assert status == 503 and "app secret invalid" in body["reason"]
    assert body["transport"]["state"] == "backing_off"
    assert len(events(srv, "ws.backing_off")) == 1 and len(events(srv, "ws.connecting")) == 1
    ws.app_secret = None                                                  # the operator fixed it
    body = await wait_health(srv, 200)
    assert body["transport"]["connects"] == 1
    mid = await asyncio.to_thread(ws.push, make_text_event("hello at last", chat_id="oc_p2p_alice"))
    assert (await ws.wait_ack_async(mid)).code == 200
    [reply] = await lark.wait_for_messages_async(1, timeout=20)
    assert reply.text == "echo: hello at last"
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_watchdog_reconnects_a_connection_that_went_silent(server, ws, lark):
    """No pong and no frame for twice the ping interval (2 s here): the connection is closed
    and made again, though the socket itself never closed."""
    srv = server()
    await srv.start_ready()
    assert ws.go_silent() == 1
    silent_at = time.monotonic()
    await asyncio.to_thread(ws.wait_connections_total, 2, 20)
    took = time.monotonic() - silent_at
    assert took < 2 * 2 + 2 + 2, f"reconnected {took:.1f}s after the silence began"   # 2x ping + nonce + slack
    [first, _] = ws.connections()
    assert not first.open and first.close_reason.startswith("client closed")
    [lost] = events(srv, "ws.disconnected")
    assert lost["reason"].startswith("watchdog: no pong or frame for ")
    await wait_health(srv, 200)
    mid = await asyncio.to_thread(ws.push, make_text_event("after the silence", chat_id="oc_p2p_alice"))
    assert (await ws.wait_ack_async(mid)).code == 200
    [reply] = await lark.wait_for_messages_async(1, timeout=20)
    assert reply.text == "echo: after the silence"
    code, _ = await srv.terminate()
    assert code == 0
    no_tracebacks(srv)


async def test_unreachable_domain_is_said_clearly(server):
    srv = server(lark_domain=f"http://127.0.0.1:{free_port()}")      # nothing listens there
    srv.start()
    await wait_until(lambda: events(srv, "ws.disconnected"), 30, "the failed connection to be logged")
    [line] = events(srv, "ws.disconnected")[:1]
    assert "ConnectionError" in line["reason"] and line["domain"].startswith("http://127.0.0.1:")
    status, body = await healthz(srv)
    assert status == 503 and body["transport"]["state"] in ("disconnected", "connecting")
    assert "ConnectionError" in body["reason"] or body["transport"]["state"] == "connecting"
    code, elapsed = await srv.terminate()
    assert code == 0 and elapsed < DEADLINE


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_sigterm_closes_the_connection_and_exits_within_the_deadline(layout, server, ws, lark, model):
    model.responder = lambda req: Delay(1.5, Text(f"echo: {last_user_text(req)}"))
    srv = server(ethan_ws_own_thread=layout)
    await srv.start_ready()
    ev = make_text_event("in flight at the stop", chat_id="oc_p2p_alice")
    mid = await asyncio.to_thread(ws.push, ev)
    assert (await ws.wait_ack_async(mid)).code == 200
    code, elapsed = await srv.terminate()
    assert code == 0
    assert elapsed < DEADLINE
    [conn] = ws.connections()
    assert not conn.open                                      # closed by the client, not dropped
    assert len(lark.messages()) == 1                          # the in-flight answer was drained
    assert events(srv, "ws.stopped")
    no_tracebacks(srv)


async def test_second_sigterm_ends_a_stop_that_is_still_waiting(server, ws, model):
    model.responder = lambda req: Delay(60, Text("never in time"))
    srv = server(ethan_shutdown_deadline="30")
    await srv.start_ready()
    mid = await asyncio.to_thread(ws.push, make_text_event("hold the stop", chat_id="oc_p2p_alice"))
    assert (await ws.wait_ack_async(mid)).code == 200
    await wait_until(lambda: model.chat_requests(), 10, "the model call to start")
    srv.proc.send_signal(15)
    await wait_until(lambda: events(srv, "app.stopping"), 10, "the stop to begin")
    code, elapsed = await srv.terminate(timeout=10)           # the second SIGTERM
    assert code == 1 and elapsed < 5
    assert events(srv, "app.stop_forced")[0]["reason"] == "second signal"


# ------------------------------------------------------------------------------------------
# In process: the same client, the app's intake
# ------------------------------------------------------------------------------------------


async def test_store_failure_is_answered_500_so_lark_redelivers(tmp_path, lark, ws, model):
    async with Harness(tmp_path, lark=lark, model=model, lark_transport="ws") as h:
        await asyncio.to_thread(ws.wait_connected)
        await h.app.db.close()                 # the database is gone: nothing can be stored
        try:
            mid = await asyncio.to_thread(ws.push, make_text_event("lost?", chat_id="oc_p2p_alice"))
            assert (await ws.wait_ack_async(mid)).code == 500
        finally:
            await h.app.db.open()


async def test_two_connections_in_one_process_each_deliver(tmp_path, lark, ws, model, monkeypatch):
    from lark_oapi.ws import client as sdk

    # What importing the SDK inside the running app loop did (the old bug): its module loop is
    # the app's. Nothing here may care.
    monkeypatch.setattr(sdk, "loop", asyncio.get_running_loop())
    async with Harness(tmp_path, lark=lark, model=model, lark_transport="ws") as h:
        second = LongConnection(app_id="cli_test", app_secret="test-secret", domain=lark.base_url,
                                intake=h.app.intake, name="lark-ws-2", own_thread=True)
        second.start(asyncio.get_running_loop())
        try:
            conns = await asyncio.to_thread(ws.wait_connected, 2)
            evs = [make_text_event(f"via connection {c.id}", chat_id=f"oc_p2p_{c.id}") for c in conns]
            mids = [await asyncio.to_thread(ws.push, ev, connection=c) for ev, c in zip(evs, conns)]
            for mid in mids:
                assert (await ws.wait_ack_async(mid)).code == 200
            await lark.wait_for_messages_async(2, timeout=20)
            assert sorted(m.text for m in lark.messages()) == ["echo: via connection 1", "echo: via connection 2"]
        finally:
            await asyncio.to_thread(second.stop)
        assert second.state == "stopped" and h.app.long_connection.is_connected
        # One connection on the app loop (the default), the other on a thread of its own.
        assert h.app.long_connection.thread is None and second.thread is not None


async def test_card_click_over_the_long_connection_is_handled(tmp_path, lark, ws, model):
    """lark-oapi's own client drops CARD frames: ours stores and answers them like events (Lark
    sends clicks as ``type=event``: tests/e2e/test_card_clicks.py)."""
    from tests.fakes.lark_events import make_card_action_event

    async with Harness(tmp_path, lark=lark, model=model, lark_transport="ws") as h:
        await asyncio.to_thread(ws.wait_connected)
        mid = await asyncio.to_thread(ws.push, make_text_event("/forget all", chat_id="oc_p2p_alice"))
        assert (await ws.wait_ack_async(mid)).code == 200
        [card] = await lark.wait_for_messages_async(1, timeout=20)
        value = {"ethan": "confirm", "cmd": "/forget all confirm", "user": "ou_alice", "chat_type": "p2p"}
        click = make_card_action_event(value, chat_id="oc_p2p_alice", message_id=card.message_id)
        fid = await asyncio.to_thread(ws.push, click, msg_type="card")     # the SDK's other data type
        ack = await ws.wait_ack_async(fid)
        assert ack.code == 200 and ack.data["toast"]["type"] == "success"
        await h.idle()
        assert lark.message(card.message_id).edits == 1
