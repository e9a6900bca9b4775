"""The load generator: POSTs pre-built webhook requests from its own process.

Why a process of its own: the fakes (Lark, Anthropic) run on threads of the benchmark process,
and a client sharing their interpreter lock measures its own waiting as the server's latency.
Why raw asyncio streams rather than aiohttp's client: per request they cost a fraction of the
CPU (the request bytes are built before the clock starts; a keep-alive connection per worker,
HTTP/1.1, Content-Length or chunked answers), so on a 2-core machine the client takes as little
as possible from the server it measures — the role wrk or oha would play, neither of which can be
installed here.

Used through :func:`bench.common.post_all` / :func:`bench.common.post_at_rate`; the parent sends
``(url, requests, concurrency, rate)`` pickled on stdin and reads JSON from stdout.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
import time
from urllib.parse import urlsplit


def _raw(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; return (status, connection still usable)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.strip().lower()
    if fields.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(int(fields.get("content-length", "0")))
    return status, fields.get("connection") != "close"


class _Pool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, data: bytes) -> int:
        conn = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        try:
            writer.write(data)
            status, keep = await _response(reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            raise
        if keep:
            self.idle.append(conn)
        else:
            writer.close()
        return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def run(url: str, requests: list, concurrency: int, rate: float | None) -> dict:
    u = urlsplit(url)
    host, port, path = u.hostname or "127.0.0.1", u.port or 80, u.path or "/"
    raws = [_raw(host, port, path, headers, body) for _, headers, body in requests]
    n = len(raws)
    lat, status, sent = [0.0] * n, [0] * n, [0.0] * n
    pool = _Pool(host, port)

    async def one(i: int) -> None:
        sent[i] = t0 = time.monotonic()
        try:
            status[i] = await pool.post(raws[i])
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            status[i] = 0
        lat[i] = time.monotonic() - t0

    if rate is None:
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    else:
        start = time.monotonic()

        async def at(i: int) -> None:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await one(i)

        await asyncio.gather(*(at(i) for i in range(n)))
    pool.close()
    return {"lat": lat, "status": status, "sent": sent}


def main() -> None:
    url, requests, concurrency, rate = pickle.load(sys.stdin.buffer)
    out = asyncio.run(run(url, requests, concurrency, rate))
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
