"""Property tests (hypothesis) at the wire: arbitrary input never gets a 5xx.

- ``POST /lark/events``: arbitrary bytes and headers; plain JSON; events of arbitrary shape
  (any JSON where the fields should be, odd timestamps, nested and surrogate-laden content),
  encrypted with the right key and signed correctly or not. Never a 5xx (Lark retries those);
  a refused request (anything but 200) stores no row; the model is called at most once per
  accepted event; the handler never fails on what intake accepted.
- The console JSON API: every route, arbitrary JSON bodies (and non-JSON), arbitrary path ids
  and query strings. Never a 5xx; a 4xx changes no row and calls no model.
- Afterwards ``PRAGMA integrity_check`` is ``ok``.

One app (the real EthanApp against the fakes) serves every example, on its own thread and
loop; examples are bounded (800 webhook, 400 console, no deadline) so the file runs in well
under a minute (~15 s on a quiet machine). ``HYPOTHESIS_EXAMPLES`` scales the counts.
Reverting the non-ASCII signature fix is found within ~1500 webhook examples; the nested
console body within a few hundred.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import threading
import time
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.lark_events import encrypt
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN, Harness
from tests.reliability.support import LogCapture

# Bounded so the file stays around 10-20 s (each example is a real HTTP request, most events
# are stored and answered); HYPOTHESIS_EXAMPLES=5000 for a longer hunt.
SCALE = float(os.environ.get("HYPOTHESIS_EXAMPLES", "800")) / 800
WEBHOOK = settings(max_examples=max(1, int(800 * SCALE)), deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])
CONSOLE = settings(WEBHOOK, max_examples=max(1, int(400 * SCALE)))


class Served:
    """A Harness (app + fake Lark + fake model) on its own thread and event loop."""

    def __init__(self, home) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ethan-props", daemon=True)
        self.thread.start()
        self.h = Harness(home)
        self.run(self.h.__aenter__())
        self.port = self.h.app.port

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def count(self, table: str) -> int:
        async def q():
            return (await self.h.app.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}"))["n"]
        return self.run(q())

    def rows(self) -> dict[str, int]:
        return {t: self.count(t) for t in ("inbox", "messages", "facts", "procedures", "profile_entries",
                                            "episodes", "sessions")}

    def close(self) -> None:
        try:
            self.run(self.h.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with LogCapture() as logs:
        s = Served(tmp_path_factory.mktemp("props"))
        s.logs = logs
        try:
            yield s
        finally:
            s.close()


def request(port: int, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------

json_leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
             | st.text(max_size=16))
json_values = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=10)
odd_text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["nan", "NaN", "inf", "-Infinity", "1e999", "-1", "0", "", "\ud800", "ou_\udfff", "١٢٣",
                     "9" * 40, "1700000000000", str(int(time.time() * 1000))]),
)
header_value = st.binary(max_size=80).filter(lambda b: b"\r" not in b and b"\n" not in b and b"\0" not in b)


def _content():
    return st.one_of(
        st.text(max_size=40),
        json_values.map(lambda v: json.dumps(v)),
        st.builds(lambda t: json.dumps({"text": t}), st.text(max_size=40)),
        st.integers(1, 60_000).map(lambda n: '{"text": ' + "[" * n + "]" * n + "}"),
        st.sampled_from(['{"text": "\\ud800"}', '{"title": 1, "content": [[{"tag": "at", "user_id": 5}]]}',
                         '{"zh_cn": {"content": "x"}}', "null", "[]"]),
        json_values,
    )


def mostly(valid, odd=None):
    """Usually ``valid`` (nine in ten), else something of any JSON shape: most events get far
    enough to be stored and handled, each field is still fuzzed now and then."""
    odd = odd if odd is not None else json_values
    return st.integers(0, 19).flatmap(lambda i: odd if i in (7, 13) else valid)


ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=16)
message = st.fixed_dictionaries(
    {"message_id": mostly(ids.map(lambda t: "om_" + t), odd_text), "chat_id": mostly(
        st.sampled_from(["oc_p2p_a", "oc_p2p_b", "oc_group_c"]), odd_text),
     "message_type": mostly(st.sampled_from(["text", "text", "post", "image", "file", "merge_forward", "sticker"]),
                            odd_text),
     "content": _content()},
    optional={"chat_type": mostly(st.sampled_from(["p2p", "p2p", "group", "topic"])),
              "create_time": mostly(st.just(str(int(time.time() * 1000))), odd_text),
              "thread_id": odd_text, "root_id": odd_text,
              "mentions": json_values | st.lists(st.fixed_dictionaries(
                  {"key": st.text(max_size=8), "id": json_values | st.fixed_dictionaries(
                      {"open_id": st.sampled_from(["ou_bot", "ou_x"]) | odd_text}), "name": odd_text}), max_size=3)},
)
event = st.fixed_dictionaries(
    {"schema": mostly(st.just("2.0")),
     "header": mostly(st.fixed_dictionaries(
         {"event_id": mostly(ids.map(lambda t: "ev_" + t), odd_text),
          "event_type": mostly(st.sampled_from(["im.message.receive_v1", "im.message.receive_v1",
                                                "im.message.recalled_v1", "card.action.trigger"]), odd_text),
          "token": mostly(st.just(VERIFICATION_TOKEN), odd_text)},
         optional={"create_time": odd_text | json_values})),
     "event": mostly(st.fixed_dictionaries(
         {"message": mostly(message)},
         optional={"sender": mostly(st.fixed_dictionaries(
             {"sender_id": mostly(st.fixed_dictionaries({"open_id": mostly(ids.map(lambda t: "ou_" + t), odd_text)})),
              "sender_type": mostly(st.just("user"), odd_text)}))}))},
)
LARK_HEADERS = ["X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature", "Content-Type",
                "Content-Encoding", "Transfer-Encoding-X", "X-Forwarded-For", "Authorization"]
random_headers = st.lists(st.tuples(st.sampled_from(LARK_HEADERS) | st.from_regex(r"\AX-[A-Za-z]{1,10}\Z"),
                                    header_value), max_size=5)


_serial = iter(range(10**9))


def _freshen(ev: dict, salt: int) -> None:
    """New event and message ids (hypothesis likes to repeat "om_0": all duplicates)."""
    n = f"{next(_serial)}_{salt}"
    if isinstance(ev.get("header"), dict) and isinstance(ev["header"].get("event_id"), str):
        ev["header"]["event_id"] += "_" + n
    msg = ev.get("event", {}).get("message") if isinstance(ev.get("event"), dict) else None
    if isinstance(msg, dict) and isinstance(msg.get("message_id"), str):
        msg["message_id"] += "_" + n


@st.composite
def webhook_requests(draw):
    kind = draw(st.sampled_from(["bytes", "json", "plain_event", "signed_event", "signed_event", "signed_event",
                                 "bad_headers_event", "challenge"]))
    headers: list[tuple[str, bytes]] = []
    if kind == "bytes":
        body = draw(st.binary(max_size=3000))
        headers = draw(random_headers)
    elif kind == "json":
        body = json.dumps(draw(json_values)).encode()
        headers = draw(random_headers)
    elif kind == "challenge":
        plain = json.dumps({"type": "url_verification", "token": draw(st.just(VERIFICATION_TOKEN) | json_values),
                            "challenge": draw(json_values)}).encode()
        body = json.dumps({"encrypt": encrypt(plain, ENCRYPT_KEY)}).encode()
        headers = draw(random_headers)
    else:
        ev = draw(event)
        if draw(mostly(st.just(True), st.just(False))):
            _freshen(ev, draw(st.integers(0, 2**32)))
        plain = json.dumps(ev).encode()          # ensure_ascii: surrogates travel as escapes
        if kind == "plain_event":
            body, headers = plain, draw(random_headers)
        else:
            body = json.dumps({"encrypt": encrypt(plain, ENCRYPT_KEY)}).encode()
            if kind == "signed_event":
                # Each of the three headers usually right, sometimes anything (non-ASCII, NaN, …);
                # the signature is computed over whatever timestamp and nonce were drawn.
                ts = draw(mostly(st.integers(-400, 400).map(lambda d: str(int(time.time()) + (d if abs(d) > 390 else 0))),
                                 odd_text))
                nonce = draw(mostly(st.text(alphabet="abcdef0123456789", min_size=1, max_size=12), odd_text))
                ts_b, nonce_b = (v.encode("utf-8", "surrogatepass") for v in (ts, nonce))
                right = hashlib.sha256(ts_b + nonce_b + ENCRYPT_KEY.encode() + body).hexdigest().encode()
                sig = draw(mostly(st.just(right), header_value))
                headers = [("Content-Type", b"application/json"), ("X-Lark-Request-Timestamp", ts_b),
                           ("X-Lark-Request-Nonce", nonce_b), ("X-Lark-Signature", sig)]
                headers = [(k, v) for k, v in headers if b"\r" not in v and b"\n" not in v and b"\0" not in v]
            else:
                headers = draw(random_headers)
    return kind, headers, body


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------


def test_webhook_never_answers_5xx_and_refusals_store_nothing(served):
    accepted: list[int] = []
    statuses: dict[int, int] = {}

    @WEBHOOK
    @given(webhook_requests())
    def prop(req):
        kind, headers, body = req
        before = served.count("inbox")
        status = request(served.port, "POST", "/lark/events", headers, body)
        statuses[(kind, status)] = statuses.get((kind, status), 0) + 1
        assert status < 500, (kind, status, headers, body[:300])
        after = served.count("inbox")
        if status != 200:
            assert after == before, (kind, status)
        else:
            accepted.append(after - before)

    prop()
    print("webhook statuses:", statuses, "stored:", sum(accepted))
    served.run(served.h.idle(timeout=60))
    stored = sum(accepted)
    assert len(served.h.model.chat_requests()) <= stored
    failed = [e for e in served.logs.entries if e.get("event") in ("dispatch.job_failed", "webhook.store_failed")]
    assert not failed, failed[:3]
    served.run(asyncio.sleep(0))
    assert served.run(served.h.app.db.integrity_check()) == "ok"


IDS = st.one_of(st.sampled_from(["ou_alice", "ou_bob", "1", "0", "-1", "99999999999999999999", "s_x", "%00",
                                 "..", "ou_" + "a" * 300, "ou_%C3%A9", "%F0%9F%98%80", "%ED%A0%80"]),
                st.text(max_size=12).map(lambda t: quote(t, safe="")))
ROUTES = [("GET", "/api/users"), ("GET", "/api/users/{u}"), ("GET", "/api/users/{u}/profile"),
          ("PUT", "/api/users/{u}/profile"), ("GET", "/api/users/{u}/facts"), ("POST", "/api/users/{u}/facts"),
          ("PATCH", "/api/users/{u}/facts/{i}"), ("DELETE", "/api/users/{u}/facts/{i}"),
          ("GET", "/api/users/{u}/procedures"), ("POST", "/api/users/{u}/procedures"),
          ("DELETE", "/api/users/{u}/procedures/{i}"), ("GET", "/api/users/{u}/episodes"),
          ("DELETE", "/api/users/{u}/episodes/{i}"), ("GET", "/api/sessions"), ("GET", "/api/sessions/{i}"),
          ("DELETE", "/api/sessions/{i}"), ("POST", "/api/playground"), ("GET", "/api/{i}")]
query = st.lists(st.tuples(st.sampled_from(["user", "q", "limit", "offset", "history", "chat", "page", "x"])
                           | st.text(max_size=6), st.text(max_size=12)), max_size=4)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={
        "user_id": IDS | json_values, "name": odd_text | json_values, "text": odd_text | json_values,
        "chat": st.sampled_from(["p2p", "group"]) | json_values, "mention": json_values,
        "content": odd_text | json_values, "category": st.sampled_from(["preference", "decision", "knowledge",
                                                                         "correction"]) | json_values,
        "rule": odd_text | json_values, "context": odd_text | json_values, "document": odd_text | json_values,
        "version": json_values, "importance": json_values, "confidence": json_values,
    }).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=200),
    st.integers(1, 120_000).map(lambda n: b"[" * n + b"]" * n),
)


@st.composite
def console_requests(draw):
    method, path = draw(st.sampled_from(ROUTES))
    path = path.replace("{u}", draw(IDS)).replace("{i}", draw(IDS))
    q = draw(query)
    if q:
        path += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in q)
    body = draw(bodies) if method in ("POST", "PUT", "PATCH") else None
    ctype = draw(st.sampled_from([b"application/json", b"application/json", b"text/plain", b"application/json; charset=utf-8"]))
    return method, path, [("Content-Type", ctype)] if body is not None else [], body


def test_console_api_never_answers_5xx_and_refusals_change_nothing(served):
    statuses: dict[int, int] = {}

    @CONSOLE
    @given(console_requests())
    def prop(req):
        method, path, headers, body = req
        before, calls = served.rows(), len(served.h.model.requests)
        status = request(served.port, method, path, headers, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (method, path, status, (body or b"")[:300])
        if 400 <= status < 500:
            served.run(served.h.idle(timeout=30))
            assert served.rows() == before, (method, path, status)
            assert len(served.h.model.requests) == calls, (method, path, status)

    prop()
    print("console statuses:", statuses)
    served.run(served.h.idle(timeout=60))
    assert served.run(served.h.app.db.integrity_check()) == "ok"


# ------------------------------------------------------------------------------------------
# Attachments (issue 32): arbitrary bytes as png / pdf / docx / xlsx / pptx
# ------------------------------------------------------------------------------------------

FILES = settings(WEBHOOK, max_examples=max(1, int(60 * SCALE)))


def _seeds() -> dict[str, bytes]:
    """One real file per type (the writers the e2e tests use), for mutation."""
    import io

    import docx
    import openpyxl
    import pptx
    from PIL import Image

    from tests.e2e.test_lark_rich import pdf_with_text

    out = {}
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buf, format="PNG")
    out["png"] = buf.getvalue()
    out["pdf"] = pdf_with_text("seed text for the fuzzer")
    d = docx.Document()
    d.add_paragraph("段落一")
    buf = io.BytesIO()
    d.save(buf)
    out["docx"] = buf.getvalue()
    book = openpyxl.Workbook()
    book.active.append(["a", 1])
    buf = io.BytesIO()
    book.save(buf)
    out["xlsx"] = buf.getvalue()
    deck = pptx.Presentation()
    deck.slides.add_slide(deck.slide_layouts[1]).shapes.title.text = "标题"
    buf = io.BytesIO()
    deck.save(buf)
    out["pptx"] = buf.getvalue()
    return out


SEEDS = _seeds()


@st.composite
def attachment_bytes(draw):
    """(extension, bytes): raw bytes, or a real file of that type with bytes flipped,
    inserted, cut short or its head kept (magic numbers and zip headers intact)."""
    ext = draw(st.sampled_from(sorted(SEEDS)))
    how = draw(st.sampled_from(["raw", "flip", "flip", "truncate", "splice", "valid"]))
    seed = bytearray(SEEDS[ext])
    if how == "raw":
        data = draw(st.binary(max_size=3000))
        if draw(st.booleans()):   # with the right magic bytes, so the parser is reached
            data = bytes(seed[:8]) + data
        return ext, data
    if how == "flip":
        for _ in range(draw(st.integers(1, 12))):
            i = draw(st.integers(0, len(seed) - 1))
            seed[i] = draw(st.integers(0, 255))
    elif how == "truncate":
        seed = seed[:draw(st.integers(0, len(seed)))]
    elif how == "splice":
        i = draw(st.integers(0, len(seed)))
        seed[i:i] = draw(st.binary(min_size=1, max_size=200))
    return ext, bytes(seed)


def test_arbitrary_bytes_as_attachments_are_answered_and_finish_their_row(served):
    """Every file is answered within the parse bound (a reply, whatever it says), its inbox
    row finished (never pending), no handler failure; the server keeps answering."""
    from tests.fakes.lark_events import make_file_event, make_image_event

    h = served.h
    bound = h.app.settings.ethan_parse_timeout + 10
    outcomes: dict[str, int] = {}
    slowest = [0.0]

    @FILES
    @given(attachment_bytes())
    def prop(sample):
        ext, data = sample
        key = f"file_v3_prop_{next(_serial)}"
        chat = dict(chat_id="oc_p2p_files", sender="ou_files")
        ev = make_image_event(key, **chat) if ext == "png" else make_file_event(key, f"f.{ext}", **chat)
        mid = ev["event"]["message"]["message_id"]
        h.lark.add_resource(mid, key, data, "application/octet-stream")
        t0 = time.monotonic()
        status, _ = served.run(h.post(ev))
        assert status == 200
        while not [m for m in h.lark.messages() if m.reply_to == mid]:
            assert time.monotonic() - t0 < bound, (ext, data[:100])
            time.sleep(0.01)
        served.run(h.idle(timeout=30))
        slowest[0] = max(slowest[0], time.monotonic() - t0)

        async def row():
            return await h.app.db.fetchone("SELECT status FROM inbox WHERE dedup_key = ?", (f"msg:{mid}",))
        st_ = served.run(row())["status"]
        assert st_ == "done", (ext, st_, data[:100])
        outcomes[ext] = outcomes.get(ext, 0) + 1

    prop()
    refused = [e.get("reason") for e in served.logs.entries if e.get("event") == "attachment.refused"]
    print("attachments:", outcomes, "refused reasons:", {r: refused.count(r) for r in set(refused)},
          f"slowest {slowest[0]:.2f} s")
    failed = [e for e in served.logs.entries if e.get("event") == "dispatch.job_failed"]
    assert not failed, failed[:3]
