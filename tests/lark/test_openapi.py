"""OpenApi against the fake Lark Open API, over a real httpx client on loopback."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
import structlog

from bot.lark.openapi import (
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


@pytest.fixture
def fake():
    lark = FakeLark(app_id="cli_test", app_secret=SECRET)
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


def _track_connections(api: OpenApi) -> set:
    """Local (addr, port) of the TCP connection each response came over."""
    seen: set = set()

    async def on_response(resp: httpx.Response) -> None:
        stream = resp.extensions.get("network_stream")
        if stream is not None:
            seen.add(stream.get_extra_info("client_addr"))

    api.http.event_hooks["response"].append(on_response)
    return seen


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
    conns = _track_connections(api)
    for _ in range(15):
        await api.bot_info()
    assert len(conns) == 1, conns


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


async def test_borrowed_client_is_not_closed(fake):
    async with httpx.AsyncClient() as http:
        api = OpenApi("cli_test", SECRET, fake.base_url, http=http)
        await api.bot_info()
        await api.aclose()
        assert not http.is_closed
        await api.bot_info()  # still usable


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
