"""The delay proxy the benchmarks and replica tests put between Ethan and PostgreSQL
(tests/delay_proxy.py): each direction is delayed, bytes arrive whole and in order, and a
close is passed on (a connection ends on both sides)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tests.delay_proxy import DelayProxy


async def _echo_server() -> tuple[asyncio.AbstractServer, int, list[bytes]]:
    seen: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            seen.append(chunk)
            writer.write(chunk)
            await writer.drain()
        writer.close()             # the client's EOF ends the connection from here

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


@contextlib.asynccontextmanager
async def _echo_through_proxy(delay: float):
    """(proxy, the client's reader and writer, what the echo server received)."""
    server, port, seen = await _echo_server()
    proxy = await DelayProxy(("127.0.0.1", port), delay=delay).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        yield proxy, reader, writer, seen
        writer.close()
    finally:
        await proxy.close()
        server.close()


async def test_a_round_trip_costs_twice_the_delay():
    async with _echo_through_proxy(0.05) as (_, reader, writer, _seen):
        for _ in range(3):
            t0 = time.monotonic()
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            assert time.monotonic() - t0 >= 0.1 - 0.005      # 50 ms there, 50 ms back


async def test_bytes_arrive_whole_and_in_order_while_later_ones_are_read():
    async with _echo_through_proxy(0.02) as (_, reader, writer, _seen):
        parts = [f"{i:05d}|".encode() * (1 + i % 7) for i in range(400)]
        for i, part in enumerate(parts):
            writer.write(part)
            if i % 50 == 0:
                await asyncio.sleep(0.003)      # chunks arriving at different times
        await writer.drain()
        t0 = time.monotonic()
        got = await reader.readexactly(sum(map(len, parts)))
        assert got == b"".join(parts)
        # pipelined, not one delay per chunk: 400 chunks in far less than 400 × 40 ms
        assert time.monotonic() - t0 < 5
        big = bytes(range(256)) * 4096           # 1 MiB in one go
        writer.write(big)
        assert await reader.readexactly(len(big)) == big


async def test_a_close_is_passed_on_and_the_link_goes():
    async with _echo_through_proxy(0.01) as (proxy, reader, writer, seen):
        writer.write(b"last words")
        writer.write_eof()
        assert await reader.read() == b"last words"     # then EOF: the server closed its side
        assert b"".join(seen) == b"last words"
        for _ in range(100):
            if not proxy._links:
                break
            await asyncio.sleep(0.01)
        assert not proxy._links, "the link stayed open after both sides closed"
        assert proxy.connections == 1


async def test_a_refused_target_closes_the_client():
    server, port, _ = await _echo_server()
    server.close()
    await server.wait_closed()
    proxy = await DelayProxy(("127.0.0.1", port), delay=0.01).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await proxy.close()
