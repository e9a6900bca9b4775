"""Webhook security: decrypt, verify signature, timestamp and token (DESIGN.md §5).

Pure functions from (headers, raw body) to a verdict, so both the aiohttp route and the
tests use exactly this code. A refused request gets 401 with no detail — never 500,
which Lark would retry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

MAX_SKEW_SECONDS = 5 * 60


class Refused(Exception):
    """The request is not from Lark (or not for us): 401, reason logged only."""


class Malformed(Exception):
    """Authentic-looking but unusable: 400, reason logged only."""


@dataclass(frozen=True, slots=True)
class Verified:
    kind: str                    # "challenge" | "event" | "v1" (a schema 1.0 event, not handled)
    body: dict[str, Any]         # the decrypted JSON
    raw: str                     # the decrypted JSON text (stored verbatim in the inbox)


def decrypt(encrypted: str, encrypt_key: str) -> str:
    """AES-256-CBC, key = sha256(encrypt_key), IV = first 16 bytes; raises ValueError."""
    try:
        data = base64.b64decode(encrypted, validate=True)
    except (ValueError, TypeError) as e:
        raise ValueError("encrypt is not base64") from e
    plain = _aes_cbc_decrypt(hashlib.sha256(encrypt_key.encode()).digest(), data)
    try:
        return plain.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("decrypted bytes are not UTF-8 (wrong key?)") from e


def _aes_cbc_decrypt(key: bytes, data: bytes) -> bytes:
    """Lark's scheme, as lark-oapi's AESCipher implements it, with pycryptodome directly:
    importing lark_oapi loads the whole SDK (seconds, +140 MiB), which the webhook path and a
    console-only start never need."""
    from Crypto.Cipher import AES

    if len(data) < 2 * AES.block_size or len(data) % AES.block_size:
        raise ValueError("invalid ciphertext length")
    plain = AES.new(key, AES.MODE_CBC, data[: AES.block_size]).decrypt(data[AES.block_size:])
    pad = plain[-1] if plain else 0
    if not 1 <= pad <= AES.block_size or plain[-pad:] != bytes([pad]) * pad:
        raise ValueError("invalid PKCS7 padding")
    return plain[:-pad]


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    # surrogatepass: aiohttp hands undecodable header bytes over as surrogates; such a header
    # simply fails to match instead of raising (a 500).
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode("utf-8", "surrogatepass") + body).hexdigest()


def _same(candidate: str, secret: str) -> bool:
    """Constant-time comparison of any two strings: ``hmac.compare_digest`` raises TypeError on
    non-ASCII ``str`` (a token or signature header with one non-ASCII character was a 500)."""
    return hmac.compare_digest(candidate.encode("utf-8", "surrogatepass"), secret.encode("utf-8", "surrogatepass"))


def _header(headers: Mapping[str, str], name: str) -> str:
    v = headers.get(name)
    if v is None:
        lower = name.lower()
        for k, val in headers.items():
            if k.lower() == lower:
                return val
        return ""
    return v


def verify(
    headers: Mapping[str, str], body: bytes, *, encrypt_key: str, verification_token: str,
    now: float | None = None,
) -> Verified:
    now = time.time() if now is None else now
    try:
        outer = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:   # deep nesting is not a 500
        raise Malformed("body is not JSON") from e
    if not isinstance(outer, dict):
        raise Malformed("body is not a JSON object")

    if "encrypt" in outer:
        if not encrypt_key:
            raise Refused("encrypted body but no LARK_ENCRYPT_KEY configured")
        if not isinstance(outer["encrypt"], str):
            raise Malformed("encrypt is not a string")
        try:
            raw = decrypt(outer["encrypt"], encrypt_key)
            inner = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise Refused(f"cannot decrypt: {e}") from e
        if not isinstance(inner, dict):
            raise Malformed("decrypted body is not a JSON object")
        if not isinstance(inner.get("header", {}), dict):
            raise Malformed("decrypted header is not an object")
    else:
        if encrypt_key:
            # With an encrypt key configured, Lark always encrypts: plain bodies are forged.
            raise Refused("plain body while LARK_ENCRYPT_KEY is set")
        raw, inner = body.decode("utf-8", "replace"), outer

    is_challenge = inner.get("type") == "url_verification"
    # A v1 (schema 1.0) event carries its token at the top, like the challenge.
    is_v1 = inner.get("type") == "event_callback" and "header" not in inner
    header = inner.get("header")
    token = (inner.get("token") if is_challenge or is_v1
             else header.get("token") if isinstance(header, dict) else None)
    if verification_token and not _same(token if isinstance(token, str) else "", verification_token):
        raise Refused("verification token mismatch")

    if encrypt_key and not is_challenge:
        ts = _header(headers, "X-Lark-Request-Timestamp")
        nonce = _header(headers, "X-Lark-Request-Nonce")
        sig = _header(headers, "X-Lark-Signature")
        if not (ts and nonce and sig):
            raise Refused("missing signature headers")
        expected = signature(ts, nonce, encrypt_key, body)
        if not _same(sig.lower(), expected):
            raise Refused("bad signature")
        try:
            ts_value = float(ts)
        except ValueError as e:
            raise Refused("timestamp is not a number") from e
        # NaN compares false with everything: "abs(now - nan) > 300" let a NaN timestamp through.
        if not math.isfinite(ts_value) or not abs(now - ts_value) <= MAX_SKEW_SECONDS:
            raise Refused("timestamp outside the 5 minute window")

    if is_challenge:
        if not isinstance(inner.get("challenge"), str):
            raise Malformed("url_verification without challenge")
        return Verified("challenge", inner, raw)
    if is_v1:
        return Verified("v1", inner, raw)
    if not isinstance(inner.get("header"), dict):
        raise Malformed("no event header")
    return Verified("event", inner, raw)
