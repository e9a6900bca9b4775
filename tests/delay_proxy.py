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


class DelayProxyProcess:
    """The proxy in a process of its own (``python -m tests.delay_proxy``): whoever starts it
    (a benchmark's load generator, a test's event loop) shares no interpreter lock with it.

        with DelayProxyProcess(cluster.port, 0.001) as proxy:
            url = proxy.through(url)          # the same database, 2 ms further away
    """

    def __init__(self, target_port: int, one_way: float) -> None:
        import subprocess
        import sys
        from pathlib import Path

        self.target_port = target_port
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.delay_proxy", str(target_port), str(one_way)],
                                     cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def through(self, url: str) -> str:
        """``url`` (a loopback PostgreSQL URL on the target port) by way of the proxy."""
        return url.replace(f":{self.target_port}/", f":{self.port}/")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()

    def __enter__(self) -> "DelayProxyProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.delay_proxy TARGET_PORT ONE_WAY_SECONDS``: a proxy in a process of its
    own (the benchmark's load generator must not share an interpreter lock with it); prints
    its port on the first line, runs until killed."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    target, delay = int(args[0]), float(args[1])

    async def serve() -> None:
        proxy = await DelayProxy(("127.0.0.1", target), delay=delay).start()
        print(proxy.port, flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop
        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
