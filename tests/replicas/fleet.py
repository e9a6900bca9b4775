"""N ``ethan serve`` processes on one PostgreSQL database, and a Lark that delivers to them.

- :class:`Fleet` starts replicas as :class:`tests.reliability.support.ServerProcess`
  subprocesses (webhook transport with the verification token and encrypt key, one port and
  one ``ETHAN_HOME`` each, a distinct ``ETHAN_REPLICA_ID``, a short ``ETHAN_LEASE_SECONDS``),
  all on one ``ETHAN_DATABASE_URL`` and all against the one fake Lark Open API and the one fake
  model of the test (loopback only).
- :class:`LarkSender` is Lark's side of the webhook: a real signed, encrypted POST
  (``post_event``); anything but HTTP 200 (a 503, no answer at all) is delivered again, as
  Lark does, to the next replica behind the "load balancer" — so a test can assert on every
  status it ever got and on which events were acknowledged.
- :func:`answers` reads what the fake Lark received: distinct deliveries (uuid repeats
  collapsed) and every uuid tried, per triggering message.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.fakes.fake_anthropic import FakeAnthropic
from tests.fakes.fake_lark import FakeLark
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import (POST_ERRORS, ServerProcess, deliveries_by_trigger, post_event,
                                       reply_uuids_by_trigger)

LEASE_SECONDS = 3                # the least ETHAN_LEASE_SECONDS accepts


def mid(event: dict) -> str:
    return event["event"]["message"]["message_id"]


def text_event(chat: int, n: int, *, tag: str = "m") -> dict:
    """Message ``n`` of p2p chat ``chat``; its text carries a token the echo model repeats."""
    return make_text_event(f"{tag}-c{chat:02d}-n{n:03d}", chat_id=f"oc_p2p_r{chat}", sender=f"ou_r{chat}")


class Fleet:
    def __init__(self, root: Path, lark: FakeLark, model: FakeAnthropic, database_url: str, **env: str) -> None:
        self.root = Path(root)
        self.lark = lark
        self.model = model
        self.database_url = database_url
        self.env = env
        self.replicas: list[ServerProcess] = []

    def add(self, **env: str) -> ServerProcess:
        i = len(self.replicas)
        srv = ServerProcess(self.root / f"replica{i}", self.lark, self.model, **{
            "ethan_database_url": self.database_url,
            "ethan_database_pool": "4",
            "ethan_replica_id": f"replica-{i}",
            "ethan_lease_seconds": str(LEASE_SECONDS),
            "ethan_shutdown_deadline": "5",
            **self.env, **env})
        self.replicas.append(srv)
        return srv

    async def start(self, n: int) -> list[ServerProcess]:
        made = [self.add() for _ in range(n)]
        for srv in made:
            srv.start()
        await asyncio.gather(*(srv.wait_ready(60) for srv in made))
        return made

    def alive(self) -> list[ServerProcess]:
        return [s for s in self.replicas if s.proc is not None and s.proc.poll() is None]

    def close(self) -> None:
        for srv in self.replicas:
            srv.close()

    def errors(self, *, ignore=()) -> dict[str, list[dict]]:
        out = {}
        for srv in self.replicas:
            found = srv.errors(ignore=ignore)
            if found:
                out[srv.extra_env["ETHAN_REPLICA_ID"]] = found[:3]
        return out

    def tails(self, n: int = 15) -> str:
        return "\n".join(f"--- {s.extra_env['ETHAN_REPLICA_ID']}\n{s.tail(n)}" for s in self.replicas)

    async def health(self, srv: ServerProcess) -> int | None:
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(srv.url + "/healthz", timeout=aiohttp.ClientTimeout(total=4)) as r:
                    return r.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None


LARK_TIMEOUT_S = 3.0      # Lark gives up on a webhook request after 3 s and delivers it again


@dataclass
class LarkSender:
    """Lark's webhook delivery: POST, and deliver again until a replica answers 200 within
    Lark's 3 s (a 503, or no answer in time, is delivered again)."""
    http: aiohttp.ClientSession
    retry_after: float = 0.2
    give_up_after: float = 60.0
    statuses: list[int | None] = field(default_factory=list)
    timeline: list[tuple[float, str, int | None]] = field(default_factory=list)   # (sent at, url, status)
    acked: dict[str, str] = field(default_factory=dict)     # message id -> the replica's url that said 200
    attempts: collections.Counter = field(default_factory=collections.Counter)

    async def post(self, url: str, event: dict) -> int | None:
        sent_at = time.monotonic()
        status = await post_event(self.http, url, event, timeout=LARK_TIMEOUT_S)
        self.statuses.append(status)
        self.timeline.append((sent_at, url, status))
        self.attempts[mid(event)] += 1
        if status == 200:
            self.acked.setdefault(mid(event), url)
        return status

    async def deliver(self, urls, event: dict, *, after: float = 0.0) -> str:
        """Until acknowledged; each retry goes to the next url (``urls``: a list, or a callable
        giving the live ones). Returns the url that acknowledged it."""
        await asyncio.sleep(after)
        end = time.monotonic() + self.give_up_after
        i = 0
        while True:
            targets = urls() if callable(urls) else urls
            url = targets[i % len(targets)]
            if await self.post(url, event) == 200:
                return url
            if time.monotonic() > end:
                raise AssertionError(f"{mid(event)} never acknowledged in {self.give_up_after}s; "
                                     f"statuses {collections.Counter(self.statuses)}; {POST_ERRORS[-3:]}")
            i += 1
            await asyncio.sleep(self.retry_after)

    async def duplicate_to_all(self, urls: list[str], event: dict) -> list[int | None]:
        """One event delivered to every replica at once (Lark's redelivery racing the first)."""
        return list(await asyncio.gather(*(self.post(u, event) for u in urls)))


def answers(lark: FakeLark) -> tuple[collections.Counter, dict[str, set[str]]]:
    """(distinct deliveries per triggering message, every uuid tried per triggering message)."""
    return deliveries_by_trigger(lark), reply_uuids_by_trigger(lark, msg_types=("text", "post", "interactive"))


def assert_answered_once(lark: FakeLark, expected: set[str], *, url: str | None = None) -> None:
    """Every message in ``expected`` answered once: one delivery and one uuid each. With the
    database's ``url``, a message a later message's turn answered together with its own (its
    turn stored it, then met a database fault; issue 45 N14) counts as answered by that reply
    when it got none of its own."""
    delivered, uuids = answers(lark)
    missing = expected - set(delivered)
    if url is not None and missing:
        together = answered_together(url)
        missing = {m for m in missing if together.get(m) not in delivered}
    assert not missing, f"{len(missing)} acknowledged messages never answered: {sorted(missing)[:5]}"
    doubled = {m: n for m, n in delivered.items() if n != 1}
    assert not doubled, f"replies delivered more than once: {list(doubled.items())[:5]}"
    two = {m: u for m, u in uuids.items() if len(u) != 1}
    assert not two, f"two different replies tried for one message: {list(two.items())[:3]}"
    for m in lark.messages():
        if m.reply_to in expected:
            assert m.text.startswith("echo: "), m.text


def answered(lark: FakeLark, expected: set[str], *, url: str | None = None) -> int:
    """How many of ``expected`` are answered (with ``url``: answered together counts, as in
    ``assert_answered_once``)."""
    delivered = set(deliveries_by_trigger(lark))
    done = expected & delivered
    if url is not None and len(done) < len(expected):
        done |= {m for m, by in answered_together(url).items() if m in expected and by in delivered}
    return len(done)


def answered_together(url: str) -> dict[str, str]:
    """Message id -> the message whose reply answered it together with its own (the inbox
    row's note, written in the transaction that recorded the answer)."""
    return {m: note.removeprefix("answered with ") for m, note in pg_rows(
        url, "SELECT message_id, note FROM inbox WHERE status = 'done' AND note LIKE 'answered with %%'")}


def pg_rows(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Read the shared database from the test process (diagnostics and assertions)."""
    import psycopg
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        return list(conn.execute(sql, params).fetchall())
