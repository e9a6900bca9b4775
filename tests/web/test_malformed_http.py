"""Malformed HTTP and wrong tokens at the socket (issue 30 item 11): a request aiohttp cannot
parse gets a 400 and one `http.malformed` line, never an ERROR traceback; a body over 1 MiB
gets the documented JSON 413; wrong bearer tokens are logged and, past ten, throttled."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from bot.app import EthanApp
from tests.reliability.support import LogCapture
from tests.web.conftest import offline_settings

TOKEN = "s3cret-console-token"


async def _raw(url: str, data: bytes) -> tuple[int, bytes]:
    host, port = url.split("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(4096), 10)
        while b"\r\n\r\n" in raw and len(raw) < 64 * 1024:
            more = await asyncio.wait_for(reader.read(4096), 2)
            if not more:
                break
            raw += more
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


MALFORMED = {
    "raw UTF-8 in the query": "GET /sessions?q=乌龙 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
    "a header without a colon": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno-colon-here\r\n\r\n",
    "a header over 8 KB": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
}


@pytest.mark.parametrize("what", list(MALFORMED))
async def test_malformed_requests_get_400_and_no_error_traceback(console, caplog, what):
    with LogCapture() as logs, caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
        status, _ = await _raw(console.url, MALFORMED[what])
        await asyncio.sleep(0.1)
    assert status == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    [line] = logs.events("http.malformed")
    assert line["status"] == 400 and line["level"] == "info"
    status, _ = await console.call("GET", "/healthz")          # and the server carries on
    assert status == 200


async def test_a_body_over_one_mebibyte_gets_the_json_413(console):
    body = json.dumps({"user_id": "ou_a", "text": "x" * (1024 * 1024 + 10)}).encode()
    head = (f"POST /chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    status, raw = await _raw(console.url, head + body)
    assert status == 413
    assert json.loads(raw.decode()) == {"error": "the body is larger than 1 MiB"}


@pytest.fixture
async def remote(tmp_path):
    app = EthanApp(offline_settings(tmp_path, ethan_host="0.0.0.0", ethan_console_token=TOKEN))
    await app.start()
    import aiohttp

    http = aiohttp.ClientSession()
    try:
        yield app, http
    finally:
        await http.close()
        await app.stop()


async def test_wrong_bearer_tokens_are_logged_and_throttled(remote):
    app, http = remote
    wrong = {"Authorization": "Bearer guess"}
    with LogCapture() as logs:
        for _ in range(10):
            async with http.post(app.base_url + "/chat", json={"user_id": "ou_a", "text": "hi"}, headers=wrong) as r:
                assert r.status == 401
        async with http.get(app.base_url + "/metrics", headers=wrong) as r:
            assert r.status == 429 and r.headers["Retry-After"] and (await r.json())["error"] == "too many wrong tokens"
        # the operator's token still works at once
        async with http.get(app.base_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
    lines = logs.events("auth.bad_token")
    assert len(lines) == 11 and lines[0]["client"] == "127.0.0.1" and lines[0]["path"] == "/chat"
    assert lines[-1]["throttled"] is True and "guess" not in json.dumps(lines)
