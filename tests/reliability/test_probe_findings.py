"""Issue 17, the Low items at the webhook and the console API: each was a 500 (Lark retries a
500), a silently lost message, or a message never answered. Real signed, encrypted requests
through the fakes; raw sockets where aiohttp's client would refuse to send the bytes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest

from bot.delivery.inbox_store import Inbox
from tests.fakes.lark_events import encrypt, make_text_event, sign
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN, Harness
from tests.reliability.support import deliveries_by_trigger


def _signed_encrypted(plain: bytes, *, ts: str | None = None) -> tuple[dict, bytes]:
    body = json.dumps({"encrypt": encrypt(plain, ENCRYPT_KEY)}).encode()
    ts = ts if ts is not None else str(int(time.time()))
    return ({"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": "n1",
             "X-Lark-Signature": sign(ts, "n1", ENCRYPT_KEY, body)}, body)


async def _raw_http(port: int, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
    """One request written byte for byte (non-ASCII header values included); the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        head += b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        writer.write(head + body)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        return int(status.split()[1])
    finally:
        writer.close()


async def _post(h, headers: dict, body: bytes) -> int:
    async with h.http.post(h.url + "/lark/events", data=body, headers=headers) as r:
        await r.read()
        return r.status


async def _nothing_stored(h) -> None:
    await asyncio.sleep(0.1)
    await h.idle()
    assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 0
    assert h.model.requests == []


def _event(text="hello", **kw) -> dict:
    return make_text_event(text, chat_id="oc_p2p_alice", sender="ou_alice", token=VERIFICATION_TOKEN, **kw)


async def test_token_only_mode_odd_bodies_and_non_ascii_tokens_are_401_not_500(tmp_path, logs):
    async with Harness(tmp_path, lark_encrypt_key="") as h:
        for body in (b'{"header": "x"}', b'{"header": ["x"]}', b'{"header": {"token": 5}}',
                     b'{"type": "url_verification", "token": {"a": 1}, "challenge": "c"}'):
            assert await _post(h, {"Content-Type": "application/json"}, body) == 401, body
        ev = _event()
        ev["header"]["token"] = "pässwörd-ä"
        assert await _post(h, {"Content-Type": "application/json"},
                           json.dumps(ev, ensure_ascii=False).encode()) == 401
        await _nothing_stored(h)
    assert not logs.errors(), logs.errors()[:3]


async def test_non_ascii_signature_nan_timestamp_and_odd_decrypted_header(tmp_path, logs):
    async with Harness(tmp_path) as h:
        headers, body = _signed_encrypted(json.dumps(_event()).encode())
        raw = [(k.encode(), v.encode()) for k, v in headers.items() if k != "X-Lark-Signature"]
        for sig in ("é".encode() * 64, b"\xff\xfe" * 32, "签名".encode()):
            assert await _raw_http(h.app.port, "/lark/events", raw + [(b"X-Lark-Signature", sig)], body) == 401
        for nonce in ("ñ".encode(), b"\xff"):               # the nonce goes into the signature too
            other = [(k, v) for k, v in raw if k != b"X-Lark-Request-Nonce"]
            status = await _raw_http(h.app.port, "/lark/events",
                                     other + [(b"X-Lark-Request-Nonce", nonce),
                                              (b"X-Lark-Signature", headers["X-Lark-Signature"].encode())], body)
            assert status == 401
        # A correctly signed NaN (or infinite) timestamp: abs(now - nan) > 300 is False.
        for ts in ("NaN", "nan", "inf", "-Infinity", "1e999"):
            hh, bb = _signed_encrypted(json.dumps(_event()).encode(), ts=ts)
            assert await _post(h, hh, bb) == 401, ts
        # Decrypted (so authentic-looking) but its header is not an object.
        for header in ("x", ["x"], 7):
            hh, bb = _signed_encrypted(json.dumps({"schema": "2.0", "header": header, "event": {}}).encode())
            assert await _post(h, hh, bb) == 400, header
        await _nothing_stored(h)
        ev = await h.send_text("still fine?")
        await h.replies(1)
        assert deliveries_by_trigger(h.lark) == {ev["event"]["message"]["message_id"]: 1}
    assert not logs.errors(), logs.errors()[:3]


@pytest.mark.parametrize("where", ["message", "header", "both"])
async def test_create_time_nan_is_answered_not_dropped_as_a_duplicate(tmp_path, where, logs):
    async with Harness(tmp_path) as h:
        ev = _event("nan 时间的消息")
        if where in ("message", "both"):
            ev["event"]["message"]["create_time"] = "nan"
        if where in ("header", "both"):
            ev["header"]["create_time"] = "NaN"
        status, body = await h.post(ev)
        assert status == 200 and json.loads(body)["msg"] == "accepted", body
        await h.replies(1)
        await h.idle()
        row = await h.app.db.fetchone("SELECT status, create_time FROM inbox")
        assert row["status"] == "done" and row["create_time"] > 0
    assert not logs.errors(), logs.errors()[:3]


async def test_inbox_insert_does_not_hide_a_not_null_failure(tmp_path):
    """INSERT OR IGNORE turned a NULL create_time into "duplicate" (None); now it raises for
    that row (the webhook answers 503, Lark redelivers) while the rest of its group commits."""
    from storage.sqlite import SqliteDatabase

    db = await SqliteDatabase(tmp_path / "x.db").open()
    try:
        inbox = Inbox(db)
        kw = dict(message_id=None, chat_id="oc", conv_key="oc", payload="{}")
        bad = asyncio.ensure_future(inbox.accept(event_id="ev_nan", create_time=float("nan"), **kw))
        good = asyncio.ensure_future(inbox.accept(event_id="ev_ok", create_time=time.time(), **kw))
        with pytest.raises(sqlite3.IntegrityError):
            await bad
        assert (await good) is not None
        assert await inbox.accept(event_id="ev_ok", create_time=time.time(), **kw) is None   # a real duplicate
    finally:
        await db.close()


def _plain_with(text_json: str) -> bytes:
    """An event whose message content is ``text_json`` (raw JSON text, escapes kept)."""
    ev = _event("placeholder")
    ev["event"]["message"]["content"] = "__CONTENT__"
    plain = json.dumps(ev)            # ensure_ascii: a lone surrogate stays an escape
    return plain.replace('"__CONTENT__"', json.dumps(text_json)).encode()


@pytest.mark.parametrize("case", ["content_nested_deep", "lone_surrogate_text", "lone_surrogate_everywhere",
                                  "event_nested_300"])
async def test_hostile_message_content_gets_a_short_answer_and_the_row_finishes(tmp_path, case, logs):
    async with Harness(tmp_path) as h:
        if case == "content_nested_deep":
            plain = _plain_with('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}")
        elif case == "lone_surrogate_text":      # the escape in the event's JSON, as a client may send it
            plain = json.dumps(_event("hello SURR there")).replace("SURR", "\\ud800").encode()
        elif case == "lone_surrogate_everywhere":
            ev = _event("x")
            plain = json.dumps(ev).replace("ou_alice", "ou_alice\\udfff").encode()
            plain = plain.replace(b'"hello"', b'"\\ud83d hi"').replace(b'"x"', b'"\\ud83d"')
        else:                          # an unknown field nested deeper than pydantic's JSON parser goes
            ev = _event("deep but fine")
            ev["event"]["extra"] = "__DEEP__"
            plain = json.dumps(ev).replace('"__DEEP__"', "[" * 300 + "]" * 300).encode()
        headers, body = _signed_encrypted(plain)
        assert await _post(h, headers, body) == 200
        [reply] = await h.replies(1)
        assert 0 < len(reply.text) < 400
        await h.idle()
        rows = await h.app.db.fetchall("SELECT status, attempts FROM inbox")
        assert [(r["status"], r["attempts"]) for r in rows] == [("done", 1)], [dict(r) for r in rows]
        assert await h.app.db.integrity_check() == "ok"
    assert not logs.errors(), logs.errors()[:3]


async def test_console_api_body_nested_100k_deep_is_400(tmp_path, logs):
    async with Harness(tmp_path) as h:
        deep = b"[" * 100_000 + b"]" * 100_000
        for path in ("/api/playground", "/api/users/ou_alice/facts"):
            async with h.http.post(h.url + path, data=b'{"a": ' + deep + b"}",
                                   headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, (path, r.status, (await r.text())[:200])
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM facts"))["n"] == 0
    assert not logs.errors(), logs.errors()[:3]
