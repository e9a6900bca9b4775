"""Issue 17, Low: 400 connections that send half a request and stall were never closed.

aiohttp has no header or body read timeout of its own. Now a connection whose request head is
unfinished is closed at the keep-alive deadline (15 s, armed at connect and not re-armed by
trickling bytes), and a body not complete 10 s after its headers gets 408 and the connection
is closed — on /lark/events and on every other route. Real sockets; the bot keeps answering.
"""

from __future__ import annotations

import asyncio
import time

from bot.startup.web import HEADER_TIMEOUT_S
from bot.lark.transport.routes import BODY_READ_TIMEOUT_S
from tests.harness import Harness

STALLED = 400


async def _stall(port: int, kind: str, i: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if kind == "head":
        writer.write(b"POST /lark/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
    else:
        path = b"/lark/events" if i % 2 else b"/api/playground"
        writer.write(b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n" + b'{"encrypt": "' + b"A" * 487)
    await writer.drain()
    return reader, writer


async def _closed_within(reader, seconds: float) -> tuple[bool, bytes]:
    """(closed by the server within ``seconds``, what it sent before closing)."""
    got = b""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            chunk = await asyncio.wait_for(reader.read(4096), max(0.01, end - time.monotonic()))
            if not chunk:
                return True, got
            got += chunk
    except (asyncio.TimeoutError, ConnectionError):
        pass
    return False, got


async def test_stalled_heads_and_half_bodies_are_answered_and_closed(tmp_path, logs):
    async with Harness(tmp_path) as h:
        conns = [await _stall(h.app.port, "head" if i % 2 else "body", i) for i in range(STALLED)]
        t0 = time.monotonic()
        # The bot answers real events meanwhile.
        await h.send_text("慢客户端之外的消息")
        await h.replies(1)
        results = await asyncio.gather(*(_closed_within(r, HEADER_TIMEOUT_S + 10) for r, _ in conns))
        elapsed = time.monotonic() - t0
        open_still = [i for i, (closed, _) in enumerate(results) if not closed]
        assert not open_still, f"{len(open_still)} of {STALLED} stalled connections still open after {elapsed:.0f}s"
        bodies = [got for i, (_, got) in enumerate(results) if i % 2 == 0]
        assert all(b.startswith(b"HTTP/1.1 408") for b in bodies), {b[:40] for b in bodies}
        for _, w in conns:
            w.close()
        assert BODY_READ_TIMEOUT_S <= HEADER_TIMEOUT_S
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 1
    assert not logs.errors(), logs.errors()[:3]
