"""A pool of parse worker processes: untrusted files are read here, never on the event loop.

Each job runs in a spawned worker (bot/media/parse_worker.py) under three limits:

* CPU time per job (RLIMIT_CPU, ``cpu_seconds``): the kernel ends the worker;
* wall clock per job (``timeout``): the pool kills the worker (a stuck C loop, a machine
  so loaded that CPU time never adds up);
* memory (RLIMIT_AS, ``memory_mb``): allocations fail inside the worker (MemoryError).

A worker that died or was killed is replaced on the next job; the others go on. Every way a
job can fail is one ``ParseFailed(reason, detail, cause)``: the caller answers "this file
could not be read". The loop only ever waits on a future: the pipe is written and read by a
small thread pool of the pool's own, one thread per worker.

Workers start on the first job (most chats never send a file; the tests start many apps) and
stay for the next; ``stop()`` ends them all.

Fair per sender (issue 45, N6): every job names who sent it (``key``: the sender, across all
their chats). One sender holds at most ``per_sender`` workers at once (half the pool, at least
one), so a member whose files run to the time limit, from any number of chats, never holds the
whole pool: their further jobs wait behind their own. A free worker goes to the waiting sender
with the fewest jobs running, then the one served longest ago (round robin), so another
sender's small file is read next, not after the bomber's queue. Waiting is bounded: at most
``queue_per_sender`` jobs of one sender and ``queue_total`` of all wait; past either the job is
refused (``ParseFailed`` reason ``busy`` / ``overloaded``) and the user told to send it again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bot.infra.log import get_logger

log = get_logger("ethan.parse")


class ParseFailed(Exception):
    def __init__(self, reason: str, detail: str = "", cause: str = "parser") -> None:
        super().__init__(f"{reason}: {detail} ({cause})")
        self.reason, self.detail, self.cause = reason, detail, cause


@dataclass(frozen=True, slots=True)
class ParseLimits:
    workers: int = 2
    cpu_seconds: float = 10.0
    timeout: float = 20.0
    memory_mb: int = 768
    per_sender: int = 0           # workers one sender may hold at once; 0: half the pool, at least 1
    queue_per_sender: int = 4     # one sender's jobs waiting behind their own; more: refused
    queue_total: int = 64         # every sender's waiting jobs together; more: refused

    def sender_cap(self) -> int:
        # Below the pool size whenever the pool has two workers or more: someone else's file
        # always finds a worker free of this sender.
        return self.per_sender or max(1, self.workers // 2)


class _Worker:
    def __init__(self, ctx, limits: ParseLimits) -> None:
        from bot.media import parse_worker

        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=parse_worker.serve, name="ethan-parse", daemon=True,
                                args=(child, limits.cpu_seconds, limits.memory_mb * 1024 * 1024))
        self.proc.start()
        child.close()
        self.jobs = 0

    def call(self, job: tuple, timeout: float) -> tuple:
        """In a pool thread: send, wait at most ``timeout``, receive."""
        try:
            self.conn.send(job)
            if not self.conn.poll(timeout):
                return ("timeout",)
            return self.conn.recv()
        except (EOFError, OSError):
            return ("died",)

    def kill(self) -> None:
        """In a pool thread (join waits for the kernel to reap it)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def exit_cause(self) -> str:
        self.proc.join(2)
        code = self.proc.exitcode
        if code == -signal.SIGXCPU:
            return "cpu"
        if code == -signal.SIGKILL:
            return "killed"     # the OOM killer, or an operator
        return f"exit {code}"


class ParsePool:
    def __init__(self, limits: ParseLimits | None = None) -> None:
        self.limits = limits or ParseLimits()
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        # The scheduler (see the module's docstring): jobs running per sender, the senders'
        # waiting jobs (FIFO each), the tick each sender last got a worker at.
        self._running = 0
        self._in_flight: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future]] = {}
        self._queued = 0
        self._served: dict[str, int] = {}
        self._tick = 0
        self._threads = ThreadPoolExecutor(max_workers=self.limits.workers + 1, thread_name_prefix="ethan-parse")
        self._closed = False
        self.started = 0       # workers started, for the tests and /metrics-style counts
        self.replaced = 0

    def pids(self) -> list[int]:
        return [w.proc.pid for w in (*self._idle, *self._busy) if w.proc.pid]

    def load(self) -> tuple[int, int]:
        """(jobs running, jobs waiting): for the tests and the bench."""
        return self._running, self._queued

    async def run(self, job: str, *args, key: str = "") -> object:
        """The reader's result, or ParseFailed. ``key``: who sent the file (fairness, above)."""
        if self._closed:
            raise ParseFailed("unreadable", "stopping", "stopping")
        loop = asyncio.get_running_loop()
        await self._acquire(key, loop)
        try:
            worker = self._idle.pop() if self._idle else None
            if worker is None or not worker.proc.is_alive():
                if worker is not None:
                    await loop.run_in_executor(self._threads, worker.kill)
                worker = await loop.run_in_executor(self._threads, _Worker, self._ctx, self.limits)
                self.started += 1
            self._busy.add(worker)
            healthy = False
            try:
                got = await loop.run_in_executor(self._threads, worker.call, (job, args), self.limits.timeout)
                if got[0] == "ok":
                    healthy = True
                    return got[1]
                if got[0] == "refused":
                    healthy = got[3] != "memory"    # after a MemoryError the heap is suspect
                    raise ParseFailed(got[1], got[2], got[3])
                if got[0] == "timeout":
                    raise ParseFailed("unreadable", f"no result within {self.limits.timeout:g} s", "timeout")
                cause = await loop.run_in_executor(self._threads, worker.exit_cause)
                raise ParseFailed("unreadable", f"the parse worker died ({cause})",
                                  "cpu" if cause == "cpu" else "worker_died")
            finally:
                self._busy.discard(worker)
                worker.jobs += 1
                if healthy and not self._closed:
                    self._idle.append(worker)
                else:
                    # Killed from a thread so a cancelled caller (shutdown) does not wait on it.
                    self.replaced += 1
                    try:
                        loop.run_in_executor(self._threads, worker.kill)
                    except RuntimeError:      # stopped meanwhile: no reaping thread, just end it
                        worker.proc.kill()
        finally:
            self._release(key)

    # -- the scheduler: all on the loop, no awaits between a check and its update ------------

    async def _acquire(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        """A worker slot for ``key``'s job: at once, after the jobs ahead of it, or ParseFailed."""
        cap = self.limits.sender_cap()
        mine = self._waiting.get(key)
        if self._running < self.limits.workers and self._in_flight.get(key, 0) < cap and not mine:
            # A free slot with nobody eligible waiting (_dispatch hands each freed slot out at once).
            self._start(key)
            return
        if mine is not None and len(mine) >= self.limits.queue_per_sender:
            raise ParseFailed("busy", f"{len(mine)} of this sender's files already waiting, "
                              f"{self._in_flight.get(key, 0)} being read", "sender_queue")
        if self._queued >= self.limits.queue_total:
            raise ParseFailed("overloaded", f"{self._queued} files waiting", "queue_full")
        turn = loop.create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        self._queued += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self._release(key)          # granted, then cancelled before it ran: hand it on
            elif not turn.done() or turn.cancelled():
                self._unqueue(key, turn)
            raise

    def _start(self, key: str) -> None:
        self._running += 1
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._tick += 1
        self._served[key] = self._tick

    def _unqueue(self, key: str, turn: asyncio.Future) -> None:
        q = self._waiting.get(key)
        if q is not None and turn in q:
            q.remove(turn)
            self._queued -= 1
            if not q:
                del self._waiting[key]
                self._forget(key)

    def _release(self, key: str) -> None:
        self._running -= 1
        left = self._in_flight.get(key, 1) - 1
        if left:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)
            self._forget(key)
        self._dispatch()

    def _forget(self, key: str) -> None:
        # Nothing running and nothing waiting: the sender leaves the books (bounded by activity).
        if key not in self._in_flight and key not in self._waiting:
            self._served.pop(key, None)

    def _dispatch(self) -> None:
        """Hand free slots to waiting senders: fewest running first, then least recently served."""
        cap = self.limits.sender_cap()
        while self._running < self.limits.workers and self._waiting and not self._closed:
            ready = [k for k in self._waiting if self._in_flight.get(k, 0) < cap]
            if not ready:
                return
            key = min(ready, key=lambda k: (self._in_flight.get(k, 0), self._served.get(k, 0)))
            q = self._waiting[key]
            turn = q.popleft()
            self._queued -= 1
            if not q:
                del self._waiting[key]
            if turn.done():          # cancelled and not yet taken out (never expected): skip it
                self._forget(key)
                continue
            self._start(key)
            turn.set_result(None)

    async def stop(self) -> None:
        """End every worker (idle ones are told, busy ones killed) and the pipe threads."""
        if self._closed:
            return
        self._closed = True
        for q in self._waiting.values():        # waiting jobs: "stopping", like a new one
            for turn in q:
                if not turn.done():
                    turn.set_exception(ParseFailed("unreadable", "stopping", "stopping"))
        self._waiting.clear()
        self._queued = 0
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        for w in workers:
            try:
                if w in self._busy:
                    w.proc.kill()
                else:
                    w.conn.send(None)
            except (OSError, ValueError):
                pass

        def reap() -> None:
            for w in workers:
                w.proc.join(2)
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(2)
                w.conn.close()

        await asyncio.get_running_loop().run_in_executor(self._threads, reap)
        self._threads.shutdown(wait=False, cancel_futures=True)
        if workers:
            log.info("parse.stopped", workers=len(workers), started=self.started, replaced=self.replaced)


def rss_kib(pid: int) -> int:
    """Resident set size of a process (Linux), 0 when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


__all__ = ["ParsePool", "ParseLimits", "ParseFailed", "rss_kib"]
