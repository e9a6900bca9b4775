"""A pool of parse worker processes: untrusted files are read here, never on the event loop.

Each job runs in a spawned worker (bot/parse_worker.py) under three limits:

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
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bot.log import get_logger

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


class _Worker:
    def __init__(self, ctx, limits: ParseLimits) -> None:
        from bot import parse_worker

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
        self._slots = asyncio.Semaphore(self.limits.workers)
        self._threads = ThreadPoolExecutor(max_workers=self.limits.workers + 1, thread_name_prefix="ethan-parse")
        self._closed = False
        self.started = 0       # workers started, for the tests and /metrics-style counts
        self.replaced = 0

    def pids(self) -> list[int]:
        return [w.proc.pid for w in (*self._idle, *self._busy) if w.proc.pid]

    async def run(self, job: str, *args) -> object:
        """The reader's result, or ParseFailed."""
        if self._closed:
            raise ParseFailed("unreadable", "stopping", "stopping")
        loop = asyncio.get_running_loop()
        async with self._slots:
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

    async def stop(self) -> None:
        """End every worker (idle ones are told, busy ones killed) and the pipe threads."""
        if self._closed:
            return
        self._closed = True
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
