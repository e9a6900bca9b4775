"""OpenApi against the fake Lark Open API, over a real aiohttp client session on loopback."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
import structlog
from aiohttp import web

from bot.lark.openapi.client import (
    CODE_CATEGORIES,
    DECISIONS,
    BotInfo,
    Category,
    LarkApiError,
    OpenApi,
    classify,
)
from tests.fakes.fake_lark import FakeLark, rate_limited, server_error, token_invalid

SECRET = "s3cr3t-app-secret"


class PeerRecordingLark(FakeLark):
    """The fake Lark, also noting the client's (addr, port) of each request's TCP connection."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.peers: list = []

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await super()._dispatch(request)


@pytest.fixture
def fake():
    lark = PeerRecordingLark(app_id="cli_test", app_secret=SECRET)
    lark.start()
    try:
        yield lark
    finally:
        lark.stop()


@pytest.fixture
async def api(fake):
    client = OpenApi("cli_test", SECRET, fake.base_url, timeout=5)
    try:
        yield client
    finally:
        await client.aclose()


async def test_token_fetched_once_and_reused(fake, api):
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):
            assert await api.bot_info() == BotInfo(open_id="ou_bot", app_name="Ethan")
        # concurrent callers share the cached token too
        await asyncio.gather(*(api.bot_info() for _ in range(10)))

    assert fake.token_fetches == 1
    assert api.token_fetches == 1
    assert len(fake.calls_to("tenant_access_token")) == 1
    tokens = {c.header("Authorization") for c in fake.calls_to("/bot/v3/info")}
    assert len(tokens) == 1
    # secrets and tokens never reach the logs
    token = next(iter(tokens)).split()[-1]
    flat = repr(logs)
    assert SECRET not in flat and token not in flat


async def test_sequential_calls_use_a_single_connection(fake, api):
    for _ in range(15):
        await api.bot_info()
    # the token fetch and all 15 calls arrived over one TCP connection (seen from the server)
    assert len(fake.calls) == len(fake.peers) == 16
    assert len(set(fake.peers)) == 1, fake.peers


async def test_session_is_made_in_the_loop_on_first_use_and_closed_by_aclose(fake):
    api = OpenApi("cli_test", SECRET, fake.base_url)
    assert api._http is None               # nothing made outside the running loop
    await api.bot_info()
    session = api.http
    assert isinstance(session, aiohttp.ClientSession) and not session.closed
    await api.aclose()
    assert session.closed
    with pytest.raises(RuntimeError):       # no second session after close
        await api.bot_info()


async def test_concurrent_first_calls_fetch_the_token_once(fake, api):
    await asyncio.gather(*(api.bot_info() for _ in range(12)))
    assert fake.token_fetches == 1


async def test_expired_token_refreshes_once_and_retries_once(fake, api):
    await api.bot_info()
    fake.expire_tokens()
    before = len(fake.calls_to("/bot/v3/info"))
    assert (await api.bot_info()).open_id == "ou_bot"
    assert fake.token_fetches == 2
    assert len(fake.calls_to("/bot/v3/info")) == before + 2  # rejected call + one retry
    # and the new token is then reused
    await api.bot_info()
    assert fake.token_fetches == 2


async def test_expired_token_concurrent_callers_refresh_once(fake, api):
    await api.bot_info()
    fake.expire_tokens()
    await asyncio.gather(*(api.bot_info() for _ in range(8)))
    assert fake.token_fetches == 2


async def test_token_rejected_twice_gives_up_after_one_retry(fake, api):
    await api.bot_info()
    fake.fail_next("/bot/v3/info", times=5, **token_invalid())
    before = len(fake.calls_to("/bot/v3/info"))
    with pytest.raises(LarkApiError) as ei:
        await api.bot_info()
    assert ei.value.category is Category.TOKEN and ei.value.code == 99991663
    assert len(fake.calls_to("/bot/v3/info")) == before + 2
    assert fake.token_fetches == 2


async def test_wrong_secret_is_a_permission_error(fake):
    bad = OpenApi("cli_test", "wrong", fake.base_url)
    try:
        with pytest.raises(LarkApiError) as ei:
            await bad.bot_info()
        assert ei.value.code == 10014 and ei.value.category is Category.PERMISSION
        assert "wrong" not in str(ei.value)
    finally:
        await bad.aclose()


async def test_rate_limit_error_carries_retry_after_and_log_id(fake, api):
    fake.fail_next("/bot/v3/info", **rate_limited(3))
    with pytest.raises(LarkApiError) as ei:
        await api.bot_info()
    e = ei.value
    assert (e.code, e.http_status, e.category) == (99991400, 429, Category.RATE_LIMITED)
    assert e.retry_after_s == 3.0
    assert e.log_id and e.log_id.startswith("fake")
    assert e.path == "/open-apis/bot/v3/info"


async def test_server_error_and_gateway_page_are_transient(fake, api):
    fake.fail_next("/bot/v3/info", **server_error(502))
    with pytest.raises(LarkApiError) as ei:
        await api.bot_info()
    assert ei.value.category is Category.TRANSIENT
    fake.set_down(5)
    try:
        with pytest.raises(LarkApiError) as ei:
            await api.bot_info()
        assert ei.value.http_status == 503 and ei.value.category is Category.TRANSIENT
    finally:
        fake.set_down(0)


async def test_connection_reset_is_transient_and_not_resent(fake, api):
    await api.bot_info()                    # a pooled keep-alive connection exists now
    for method, path in [("GET", "/open-apis/bot/v3/info"),
                         ("PUT", "/open-apis/cardkit/v1/cards/c1/elements/e1/content"),
                         ("POST", "/open-apis/im/v1/messages/om_1/reply")]:
        fake.fail_next(path, disconnect=True)
        before = len(fake.calls_to(path))
        with pytest.raises(LarkApiError) as ei:
            await api.request(method, path, json={"content": "x", "sequence": 1} if method != "GET" else None)
        e = ei.value
        assert (e.code, e.http_status, e.category) == (-1, None, Category.TRANSIENT), e
        assert e.transient and e.path == path
        # one request on the wire: a reset is the caller's decision (same uuid / next
        # sequence), not silently resent by the transport (aiohttp would, for GET/PUT)
        assert len(fake.calls_to(path)) == before + 1, (method, fake.calls_to(path))
    assert (await api.bot_info()).open_id == "ou_bot"   # and the pool recovers


async def test_timeout_is_transient(fake):
    api = OpenApi("cli_test", SECRET, fake.base_url, timeout=1.0)
    try:
        await api.bot_info()
        fake.stall_next("/bot/v3/info", 60)  # released when the fake stops
        with pytest.raises(LarkApiError) as ei:
            await api.bot_info()
        e = ei.value
        assert (e.code, e.http_status, e.category) == (-1, None, Category.TRANSIENT), e
        assert "Timeout" in e.msg
    finally:
        await api.aclose()


@pytest.fixture
async def gateway():
    """A tiny Open API stand-in on this loop: tokens work, everything else is scripted."""
    answers: dict[str, web.Response] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/tenant_access_token/internal"):
            return web.json_response({"code": 0, "tenant_access_token": "t-1", "expire": 7200})
        make = answers.get(request.path)
        return make() if make else web.json_response({"code": 0, "data": {}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    api = OpenApi("cli_test", SECRET, f"http://127.0.0.1:{port}", timeout=5)
    try:
        yield api, answers
    finally:
        await api.aclose()
        await runner.cleanup()


async def test_non_json_gateway_page_is_transient_with_retry_after(gateway):
    api, answers = gateway
    answers["/open-apis/bot/v3/info"] = lambda: web.Response(
        status=503, content_type="text/html", text="<html><body>503 Service Unavailable</body></html>",
        headers={"Retry-After": "7", "X-Tt-Logid": "gw-log-1"})
    answers["/open-apis/im/v1/messages"] = lambda: web.Response(
        status=502, content_type="text/html", text="<html>Bad Gateway</html>",
        headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    with pytest.raises(LarkApiError) as ei:
        await api.bot_info()
    e = ei.value
    assert (e.code, e.http_status, e.category) == (-1, 503, Category.TRANSIENT)
    assert e.retry_after_s == 7.0 and e.log_id == "gw-log-1"
    assert "text/html" in e.msg and e.path == "/open-apis/bot/v3/info"
    with pytest.raises(LarkApiError) as ei:
        await api.request("POST", "/open-apis/im/v1/messages", json={})
    assert ei.value.category is Category.TRANSIENT and ei.value.retry_after_s == 0.0  # a past date


async def test_json_body_is_parsed_whatever_the_content_type(gateway):
    api, answers = gateway
    answers["/open-apis/bot/v3/info"] = lambda: web.Response(
        status=200, content_type="text/plain",
        body=json.dumps({"code": 0, "data": {"bot": {"open_id": "ou_x", "app_name": "伊森"}}}).encode())
    answers["/open-apis/im/v1/messages/om_1/reply"] = lambda: web.Response(
        status=400, content_type="text/plain", text=json.dumps({"code": 230011, "msg": "recalled"}))
    assert await api.bot_info() == BotInfo(open_id="ou_x", app_name="伊森")
    with pytest.raises(LarkApiError) as ei:
        await api.request("POST", "/open-apis/im/v1/messages/om_1/reply", json={})
    assert (ei.value.code, ei.value.http_status, ei.value.category) == (230011, 400, Category.GONE)


async def test_json_bodies_and_query_params_on_the_wire(fake, api):
    content = json.dumps({"text": "你好，Ethan — ✓ 😀"}, ensure_ascii=False)
    await api.request("POST", "/open-apis/im/v1/messages",
                      json={"receive_id": "oc_1", "msg_type": "text", "content": content, "uuid": "u-1"},
                      params={"receive_id_type": "chat_id"})
    [call] = fake.calls_to("/im/v1/messages", method="POST")
    assert call.query == {"receive_id_type": "chat_id"}
    assert call.json["content"] == content and call.json["uuid"] == "u-1"
    assert "你好".encode() in call.body                                  # UTF-8, not \u escapes
    assert call.header("Content-Type") == "application/json; charset=utf-8"
    assert call.header("Authorization", "").startswith("Bearer ")
    assert call.header("User-Agent") == "ethan-lark-bot"
    [msg] = fake.messages()
    assert msg.text == "你好，Ethan — ✓ 😀"

    await api.request("GET", "/open-apis/contact/v3/users/ou_a b",
                      params={"user_id_type": "open_id", "flag": True, "off": False, "ids": ["a", "b&c"]})
    [call] = fake.calls_to("/contact/v3/users/")
    assert call.path == "/open-apis/contact/v3/users/ou_a b"
    assert call.query_string.split("&") == ["user_id_type=open_id", "flag=true", "off=false", "ids=a",
                                            "ids=b%26c"]


async def test_network_error_is_transient():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    dead = OpenApi("cli_test", SECRET, f"http://127.0.0.1:{port}", timeout=2)
    try:
        with pytest.raises(LarkApiError) as ei:
            await dead.bot_info()
        assert ei.value.code == -1 and ei.value.http_status is None
        assert ei.value.category is Category.TRANSIENT and ei.value.transient
    finally:
        await dead.aclose()


async def test_borrowed_session_is_not_closed(fake):
    async with aiohttp.ClientSession() as http:
        api = OpenApi("cli_test", SECRET, fake.base_url, http=http)
        await api.bot_info()
        await api.aclose()
        assert not http.closed
        await api.bot_info()  # still usable
    assert len(fake.calls_to("/bot/v3/info")) == 2


# ---- the classification table ---------------------------------------------------------------


def test_every_category_maps_to_a_retry_decision():
    assert set(DECISIONS) == set(Category)
    for code, category in CODE_CATEGORIES.items():
        assert category in DECISIONS, code
    retried = {c for c, d in DECISIONS.items() if d.retry}
    assert retried == {Category.RATE_LIMITED, Category.TRANSIENT}
    assert DECISIONS[Category.GONE].fresh_send and not DECISIONS[Category.GONE].retry
    assert DECISIONS[Category.TOKEN].refresh_token


@pytest.mark.parametrize(
    "code,status,category",
    [
        (99991400, 429, Category.RATE_LIMITED),   # gateway rate limit (lark-oapi says "permission")
        (99991400, 400, Category.RATE_LIMITED),
        (230020, 400, Category.RATE_LIMITED),     # per-chat frequency (lark-oapi says "target gone")
        (-1, 429, Category.RATE_LIMITED),
        (99991663, 400, Category.TOKEN),
        (99991661, 400, Category.TOKEN),
        (99991668, 401, Category.TOKEN),
        (-1, None, Category.TRANSIENT),           # network
        (-1, 503, Category.TRANSIENT),            # gateway page
        (1500, 500, Category.TRANSIENT),
        (230011, 400, Category.GONE),             # recalled
        (231003, 400, Category.GONE),             # deleted
        (230002, 400, Category.PERMISSION),
        (99991672, 400, Category.PERMISSION),
        (230001, 400, Category.BAD_REQUEST),
        (230025, 400, Category.BAD_REQUEST),
        (300317, 400, Category.BAD_REQUEST),
        (424242, 400, Category.UNKNOWN),
    ],
)
def test_classification(code, status, category):
    assert classify(code, status) is category
