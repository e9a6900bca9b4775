"""Webhook hostility (issue item 3): forged, malformed, oversized and unexpected requests to
``POST /lark/events``. Each gets its 4xx (or a 200 for a valid event the bot ignores) —
never a 500, which Lark would retry — and none reaches the model or the database. The
server keeps answering real events afterwards.

The forged-signature, old-timestamp and wrong-token cases also exist in
tests/e2e/test_skeleton.py; they are repeated here inside the full table so this file alone
states the property.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from tests.fakes.lark_events import encrypt, make_text_event, sign, webhook_request
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN, Harness
from tests.reliability.support import deliveries_by_trigger

MB = 1024 * 1024


def _signed(body: bytes, *, ts: str | None = None, nonce: str = "n0nce") -> dict:
    ts = ts or str(int(time.time()))
    return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts,
            "X-Lark-Request-Nonce": nonce, "X-Lark-Signature": sign(ts, nonce, ENCRYPT_KEY, body)}


def _encrypted_body(plain: str, key: str = ENCRYPT_KEY) -> bytes:
    return json.dumps({"encrypt": encrypt(plain, key)}).encode()


def _event() -> dict:
    return make_text_event("hostile hello", chat_id="oc_p2p_mallory", sender="ou_mallory",
                           token=VERIFICATION_TOKEN)


def _case(name: str) -> tuple[dict, bytes]:
    """(headers, body) of one hostile request."""
    ev = _event()
    good_headers, good_body = webhook_request(ev, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
    now = int(time.time())
    if name == "bad_signature":
        return {**good_headers, "X-Lark-Signature": "0" * 64}, good_body
    if name == "signature_of_another_body":
        return {**good_headers, "X-Lark-Signature": sign(good_headers["X-Lark-Request-Timestamp"],
                                                         good_headers["X-Lark-Request-Nonce"], ENCRYPT_KEY,
                                                         good_body + b" ")}, good_body
    if name == "old_timestamp":
        return webhook_request(ev, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN,
                               timestamp=now - 6 * 60)
    if name == "future_timestamp":
        return webhook_request(ev, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN,
                               timestamp=now + 6 * 60)
    if name == "timestamp_not_a_number":
        return _signed(good_body, ts="yesterday"), good_body
    if name == "wrong_token":
        return webhook_request(ev, encrypt_key=ENCRYPT_KEY, verification_token="forged")
    if name == "no_token":
        ev["header"].pop("token")
        body = _encrypted_body(json.dumps(ev))
        return _signed(body), body
    if name.startswith("missing_"):
        header = {"missing_timestamp": "X-Lark-Request-Timestamp", "missing_nonce": "X-Lark-Request-Nonce",
                  "missing_signature": "X-Lark-Signature"}.get(name)
        if header is None:          # missing_all_headers
            return {"Content-Type": "application/json"}, good_body
        return {k: v for k, v in good_headers.items() if k != header}, good_body
    if name == "wrong_encrypt_key":
        body = _encrypted_body(json.dumps(ev), key="someone-else's-key")
        return _signed(body), body
    if name == "truncated_encryption":
        enc = json.loads(good_body)["encrypt"]
        body = json.dumps({"encrypt": enc[: len(enc) // 2]}).encode()
        return _signed(body), body
    if name == "encryption_cut_to_a_block":
        raw = base64.b64decode(json.loads(good_body)["encrypt"])
        body = json.dumps({"encrypt": base64.b64encode(raw[:32]).decode()}).encode()
        return _signed(body), body
    if name == "encrypt_not_base64":
        body = json.dumps({"encrypt": "%%%not base64%%%"}).encode()
        return _signed(body), body
    if name == "encrypt_not_a_string":
        body = json.dumps({"encrypt": 12345}).encode()
        return _signed(body), body
    if name == "encrypted_non_json":
        body = _encrypted_body("this is not json")
        return _signed(body), body
    if name == "encrypted_json_array":
        body = _encrypted_body(json.dumps([ev]))
        return _signed(body), body
    if name == "plain_body_while_encrypted":
        h, body = webhook_request(ev, encrypt_key=None, verification_token=VERIFICATION_TOKEN)
        return _signed(body), body
    if name == "non_json":
        return _signed(b"hello, bot"), b"hello, bot"
    if name == "invalid_utf8":
        body = b'{"encrypt": "\xff\xfe"}'
        return _signed(body), body
    if name == "json_array":
        return _signed(b"[1, 2, 3]"), b"[1, 2, 3]"
    if name == "empty_body":
        return _signed(b""), b""
    if name == "deeply_nested_json":
        body = b"[" * 50_000 + b"]" * 50_000
        return _signed(body), body
    if name == "deeply_nested_json_unsigned":
        body = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
        return {"Content-Type": "application/json"}, body
    if name == "schema_1_event_without_header":
        body = _encrypted_body(json.dumps({"uuid": "x", "token": VERIFICATION_TOKEN, "type": "event_callback",
                                           "event": {"type": "message"}}))
        return _signed(body), body
    if name == "challenge_without_string":
        body = _encrypted_body(json.dumps({"type": "url_verification", "token": VERIFICATION_TOKEN,
                                           "challenge": {"x": 1}}))
        return _signed(body), body
    raise AssertionError(name)


REFUSED = ["bad_signature", "signature_of_another_body", "old_timestamp", "future_timestamp",
           "timestamp_not_a_number", "wrong_token", "no_token", "missing_timestamp", "missing_nonce",
           "missing_signature", "missing_all_headers", "wrong_encrypt_key", "truncated_encryption",
           "encryption_cut_to_a_block", "encrypt_not_base64", "encrypted_non_json", "plain_body_while_encrypted"]
MALFORMED = ["non_json", "invalid_utf8", "json_array", "empty_body", "encrypt_not_a_string",
             "encrypted_json_array", "challenge_without_string"]


async def _nothing_happened(h) -> None:
    await asyncio.sleep(0.1)
    await h.idle()
    assert h.model.requests == []
    for table in ("inbox", "messages", "sessions"):
        row = await h.app.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}")
        assert row["n"] == 0, table
    assert h.lark.messages() == []


async def _raw_post(h, headers: dict, body: bytes) -> tuple[int, str]:
    async with h.http.post(h.url + "/lark/events", data=body, headers=headers) as r:
        return r.status, await r.text()


async def test_hostile_requests_get_4xx_touch_nothing_and_the_bot_still_answers(tmp_path, logs):
    async with Harness(tmp_path) as h:
        results = {}
        for name in REFUSED + MALFORMED:
            headers, body = _case(name)
            results[name] = await _raw_post(h, headers, body)
        refused = {n: r for n, r in results.items() if n in REFUSED and r != (401, "")}
        malformed = {n: r for n, r in results.items() if n in MALFORMED and r[0] != 400}
        assert not refused, refused            # 401, and no detail in the body
        assert not malformed, malformed
        assert all(body == "" for status, body in results.values())
        # A v1 (schema 1.0) event with the right token is acknowledged (issue 25: a 4xx makes
        # Lark retry it for hours) and otherwise ignored.
        headers, body = _case("schema_1_event_without_header")
        status, text = await _raw_post(h, headers, body)
        assert (status, json.loads(text)) == (200, {"code": 0, "msg": "ignored"})
        await _nothing_happened(h)
        # Still answering real events.
        ev = await h.send_text("a real question", chat_id="oc_p2p_alice", sender="ou_alice")
        await h.replies(1)
        assert deliveries_by_trigger(h.lark) == {ev["event"]["message"]["message_id"]: 1}
    assert not logs.errors(), logs.errors()[:3]


@pytest.mark.parametrize("name", ["deeply_nested_json", "deeply_nested_json_unsigned"])
async def test_deeply_nested_json_is_refused_not_a_500(tmp_path, name, logs):
    """An unauthenticated body is parsed before its signature is checked: a deeply nested
    JSON document makes ``json.loads`` raise RecursionError, which is not a ValueError."""
    async with Harness(tmp_path) as h:
        headers, body = _case(name)
        status, text = await _raw_post(h, headers, body)
        assert status in (400, 401), (status, text[:200])
        await _nothing_happened(h)


async def test_unknown_and_odd_event_types_get_200_and_are_not_stored(tmp_path, logs):
    async with Harness(tmp_path) as h:
        kinds = ["im.message.reaction.created_v1", "im.chat.member.bot.added_v1",
                 "contact.user.deleted_v3", "im.message.message_read_v1", "totally.made.up_v9"]
        for kind in kinds:
            ev = _event()
            ev["header"]["event_type"] = kind
            ev["event"] = {"anything": ["goes", {"here": 1}]}
            status, body = await h.post(ev)
            assert status == 200 and json.loads(body)["code"] == 0, (kind, status, body)
        # Valid envelope, but no usable message: acknowledged (Lark must not retry), not stored.
        no_message = _event()
        no_message["event"].pop("message")
        no_header_id = _event()
        no_header_id["header"].pop("event_id")
        for ev in (no_message, no_header_id):
            status, body = await h.post(ev)
            assert status == 200, body
        await _nothing_happened(h)
    assert not logs.errors(), logs.errors()[:3]


async def test_verification_token_mode_refuses_forgeries(tmp_path, logs):
    """An app configured without an encrypt key: plain JSON bodies, the token is the check."""
    async with Harness(tmp_path, lark_encrypt_key="") as h:
        ev = _event()
        for token in ("forged", "", VERIFICATION_TOKEN + " "):
            headers, body = webhook_request(ev, encrypt_key=None, verification_token=token)
            assert await _raw_post(h, headers, body) == (401, "")
        no_token = _event()
        no_token["header"].pop("token")
        assert await _raw_post(h, {"Content-Type": "application/json"}, json.dumps(no_token).encode()) == (401, "")
        # Encrypted bodies cannot be read without a key: refused, not a 500.
        headers, body = webhook_request(ev, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
        assert (await _raw_post(h, headers, body))[0] == 401
        await _nothing_happened(h)
        headers, body = webhook_request(ev, encrypt_key=None, verification_token=VERIFICATION_TOKEN)
        assert (await _raw_post(h, headers, body))[0] == 200
        await h.replies(1)
    assert not logs.errors(), logs.errors()[:3]


async def _stream_huge(port: int, *, chunked: bool, total: int = 10 * MB, chunk: int = 64 * 1024):
    """Send a ``total``-byte body slowly on a raw connection, watching for an early answer.
    Returns (status line, bytes of body sent when the answer came, seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /lark/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {total}\r\n\r\n"
    writer.write(head.encode())
    answer = asyncio.create_task(reader.readline())
    sent, t0 = 0, time.monotonic()
    payload = b'{"encrypt": "' + b"A" * (chunk - 13)
    try:
        while sent < total and not answer.done():
            data = payload if sent == 0 else b"A" * chunk
            writer.write((f"{len(data):x}\r\n".encode() + data + b"\r\n") if chunked else data)
            try:
                await asyncio.wait_for(writer.drain(), 2)
            except (ConnectionError, asyncio.TimeoutError):
                break
            sent += len(data)
            await asyncio.sleep(0.004)
        status = await asyncio.wait_for(answer, 5)
        return status.decode().strip(), sent, time.monotonic() - t0
    finally:
        if not answer.done():
            answer.cancel()
        writer.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_ten_megabyte_body_is_refused_before_it_is_read(tmp_path, chunked, logs):
    async with Harness(tmp_path) as h:
        status, sent, seconds = await _stream_huge(h.app.port, chunked=chunked)
        assert status.startswith("HTTP/1.1 413"), status
        assert sent < 10 * MB, "the server answered only after the whole body was sent"
        limit = 1 * MB if not chunked else 4 * MB          # loopback socket buffers hold a few MB
        assert sent <= limit, sent
        assert seconds < 3
        await _nothing_happened(h)
        await h.send_text("still there?", chat_id="oc_p2p_alice", sender="ou_alice")
        await h.replies(1)
    assert not logs.errors(), logs.errors()[:3]
