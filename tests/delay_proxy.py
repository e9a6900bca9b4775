"""A loopback TCP proxy that delays every chunk by a fixed time in each direction — what a
database on another host costs a round trip — for the benchmarks (bench scale) and the replica
tests. Order is kept per direction and throughput is not limited: each chunk is held until
``delay`` after it arrived, then written, while later chunks keep being read.

    proxy = DelayProxy(("127.0.0.1", 5432), delay=0.001)   # 1 ms each way: 2 ms a round trip
    await proxy.start(); ... proxy.port ...; await proxy.close()

Loopback only: it listens on 127.0.0.1 and forwards to the target given (a local cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class DelayProxy:
    def __init__(self, target: tuple[str, int], *, delay: float) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.connections = 0

    async def start(self) -> "DelayProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        a = self._spawn(self._pipe(reader, up_w))
        b = self._spawn(self._pipe(up_r, writer))
        await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        for t in (a, b):
            t.cancel()
        for w in (writer, up_w):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    writer.write_eof() if writer.can_write_eof() else writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()

        sender = self._spawn(deliver())
        try:
            while True:
                chunk = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay, chunk))
                if not chunk:
                    break
            await sender
        finally:
            sender.cancel()
