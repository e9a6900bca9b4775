"""Webhook security against the documented vectors and forged requests."""

from __future__ import annotations

import json
import time

import pytest

from bot.lark.transport import webhook

KEY = "test key"


def _enc(obj, key=KEY):
    from tests.fakes.lark_events import encrypt

    return json.dumps({"encrypt": encrypt(json.dumps(obj), key)}).encode()


def _headers(body: bytes, key=KEY, ts=None, nonce="n0nce"):
    ts = str(int(time.time())) if ts is None else str(ts)
    return {"X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": webhook.signature(ts, nonce, key, body)}


EVENT = {"schema": "2.0", "header": {"event_id": "e1", "event_type": "im.message.receive_v1",
                                     "token": "vtoken"}, "event": {}}


def test_known_vector_decrypts():
    assert webhook.decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "test key") == "hello world"


def test_wrong_key_fails_not_garbage():
    with pytest.raises(ValueError):
        webhook.decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "other key")


def test_signature_is_over_raw_bytes():
    body = b'{"a": 1,  "b":2}'
    sig = webhook.signature("1", "n", "k", body)
    import hashlib

    assert sig == hashlib.sha256(b"1nk" + body).hexdigest()
    assert sig != webhook.signature("1", "n", "k", json.dumps(json.loads(body)).encode())


def test_valid_encrypted_event_passes():
    body = _enc(EVENT)
    v = webhook.verify(_headers(body), body, encrypt_key=KEY, verification_token="vtoken")
    assert v.kind == "event" and v.body["header"]["event_id"] == "e1"


@pytest.mark.parametrize("mutate", ["bad_sig", "old_ts", "future_ts", "no_headers", "wrong_token",
                                    "plain_with_key", "truncated", "not_json", "wrong_key"])
def test_forged_requests_refused(mutate):
    event = dict(EVENT)
    if mutate == "wrong_token":
        event = {**EVENT, "header": {**EVENT["header"], "token": "nope"}}
    body = _enc(event, key="other key" if mutate == "wrong_key" else KEY)
    headers = _headers(body)
    if mutate == "bad_sig":
        headers["X-Lark-Signature"] = "0" * 64
    elif mutate == "old_ts":
        headers = _headers(body, ts=int(time.time()) - 301)
    elif mutate == "future_ts":
        headers = _headers(body, ts=int(time.time()) + 301)
    elif mutate == "no_headers":
        headers = {}
    elif mutate == "plain_with_key":
        body = json.dumps(event).encode()
        headers = _headers(body)
    elif mutate == "truncated":
        inner = json.loads(body)["encrypt"][:-8]
        body = json.dumps({"encrypt": inner}).encode()
        headers = _headers(body)
    elif mutate == "not_json":
        body = b"\x00not json"
        headers = _headers(body)
    with pytest.raises((webhook.Refused, webhook.Malformed)):
        webhook.verify(headers, body, encrypt_key=KEY, verification_token="vtoken")


def test_plain_mode_checks_token():
    body = json.dumps(EVENT).encode()
    assert webhook.verify({}, body, encrypt_key="", verification_token="vtoken").kind == "event"
    bad = json.dumps({**EVENT, "header": {**EVENT["header"], "token": "x"}}).encode()
    with pytest.raises(webhook.Refused):
        webhook.verify({}, bad, encrypt_key="", verification_token="vtoken")


def test_challenge_plain_and_encrypted():
    ch = {"challenge": "abc", "token": "vtoken", "type": "url_verification"}
    assert webhook.verify({}, json.dumps(ch).encode(), encrypt_key="", verification_token="vtoken").body["challenge"] == "abc"
    body = _enc(ch)
    assert webhook.verify({}, body, encrypt_key=KEY, verification_token="vtoken").kind == "challenge"
    with pytest.raises(webhook.Refused):
        webhook.verify({}, _enc({**ch, "token": "bad"}), encrypt_key=KEY, verification_token="vtoken")
