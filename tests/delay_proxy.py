"""A loopback TCP proxy that delays every chunk by a fixed time in each direction — what a
database on another host costs a round trip — for the benchmarks (bench scale) and the replica
tests. Order is kept per direction and throughput is not limited: each chunk is held until
``delay`` after it arrived, then written, while later chunks keep being read (a side that
cannot keep up pauses the reading of the other).

    proxy = DelayProxy(("127.0.0.1", 5432), delay=0.001)   # 1 ms each way: 2 ms a round trip
    await proxy.start(); ... proxy.port ...; await proxy.close()

Loopback only: it listens on 127.0.0.1 and forwards to the target given (a local cluster).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib


class DelayProxy:
    """Protocols and timers, no task per chunk: in the benchmarks the proxy shares the
    machine's cores with what it measures, so each chunk costs one callback to read it and one
    timer (per burst) to write it."""

    def __init__(self, target: tuple[str, int], *, delay: float) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._links: set[_Link] = set()
        self.connections = 0

    async def start(self) -> "DelayProxy":
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Link(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


class _Direction:
    """One direction of a link: chunks held until ``delay`` after they arrived, written in
    order (one timer for the oldest; a burst that is due goes out in one write)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, on_end) -> None:
        self.loop = loop
        self.delay = delay
        self.on_end = on_end
        self.finished = False          # its EOF passed on
        self.held: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.out: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def push(self, chunk: bytes | None) -> None:
        """``None``: the end of this direction (EOF), passed on after what came before it."""
        self.held.append((self.loop.time() + self.delay, chunk))
        if self.timer is None and self.out is not None:
            self._arm()

    def attach(self, out: asyncio.Transport) -> None:
        self.out = out
        if self.held and self.timer is None:
            self._arm()

    def _arm(self) -> None:
        self.timer = self.loop.call_at(self.held[0][0], self._flush)

    def _flush(self) -> None:
        self.timer = None
        now = self.loop.time()
        due: list[bytes] = []
        end = False
        while self.held and self.held[0][0] <= now:
            chunk = self.held.popleft()[1]
            if chunk is None:
                end = True
                break
            due.append(chunk)
        out = self.out
        if out is None or out.is_closing():
            return
        if due:
            out.write(b"".join(due))
        if end:
            self.finished = True
            if out.can_write_eof():
                out.write_eof()
            self.on_end()
        elif self.held:
            self._arm()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Link(asyncio.Protocol):
    """One client connection and its upstream one."""

    def __init__(self, proxy: DelayProxy) -> None:
        self.proxy = proxy
        self.loop = asyncio.get_running_loop()
        self.up = _Direction(self.loop, proxy.delay, self._direction_ended)       # client -> target
        self.down = _Direction(self.loop, proxy.delay, self._direction_ended)     # target -> client
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.ended = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = transport        # type: ignore[assignment]
        self.down.attach(self.client)
        self.proxy.connections += 1
        self.proxy._links.add(self)
        self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            transport, _ = await self.loop.create_connection(lambda: _Upstream(self), *self.target())
        except OSError:
            self.abort()
            return
        self.upstream = transport      # type: ignore[assignment]
        self.up.attach(self.upstream)

    def target(self) -> tuple[str, int]:
        return self.proxy.target

    def data_received(self, data: bytes) -> None:
        self.up.push(data)

    def eof_received(self) -> bool:
        self.up.push(None)
        return True                    # half-closed: the answer may still come back

    def connection_lost(self, exc: Exception | None) -> None:
        self._side_ended()

    def _direction_ended(self) -> None:
        if self.up.finished and self.down.finished:    # both ways closed: nothing more to pass
            self.abort()

    def _side_ended(self) -> None:
        self.ended += 1
        if self.ended == 1:
            # the other side goes once what was already on its way has been passed on
            self.loop.call_later(self.proxy.delay + 0.05, self.abort)
        else:
            self.abort()

    def abort(self) -> None:
        self.up.cancel()
        self.down.cancel()
        for t in (self.client, self.upstream):
            if t is not None and not t.is_closing():
                t.close()
        self.proxy._links.discard(self)

    # flow control: a side that cannot keep up stops the other from being read
    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()


class _Upstream(asyncio.Protocol):
    def __init__(self, link: _Link) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        self.link.down.push(data)

    def eof_received(self) -> bool:
        self.link.down.push(None)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._side_ended()

    def pause_writing(self) -> None:
        if self.link.client is not None:
            self.link.client.pause_reading()

    def resume_writing(self) -> None:
        if self.link.client is not None:
            self.link.client.resume_reading()


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
