"""Background consolidation: a bounded worker pool beside the reply path, never on it.

``request(session_id)`` is synchronous and never blocks: it enqueues the session
unless it is already queued; a request for a session being worked on re-runs it once
afterwards (coalescing: at most one job per session in flight). A job derives what is
due from the database (``ConsolidationStore.plan``, memory/working/consolidation_store.py: where the
progress is read and advanced) and works phase by phase, each from a fresh plan: the phase's
work and what follows its outcome are memory/working/consolidation_state.py's tables (``ACTIONS``,
``AFTER``), whose names this module maps to its methods (``WORK``, ``NEXT``):

- **compress**: the oldest ``compress_batch`` uncompressed turns -> one warm row
  (model call first, then one transaction: warm row + ``compressed_upto`` + ``warm_turns``);
- **extract** (warm absorbed ``warm_capacity`` turns): per speaking user, facts (and
  ``profile_psych`` when that user's mode is companion) from that user's own lines,
  then the warm rows fold into the rolling summary. All model calls first; then one
  transaction records the results as ``consolidation_writes`` rows together with
  ``extracted_upto``, the fold and ``warm_turns = 0``; then each row is applied
  (FactStore.add / ProfileStore.apply_extraction) and deleted.
- **episode** (session closed, messages after ``episode_upto``): first the remaining
  unextracted turns get their fact extraction (so a short session's facts are not
  lost — it never reached ``warm_capacity``), then one summary
  (``Consolidator.summarize_episode`` over rolling summary + warm + the latest turns)
  is written as one episode per participating user with >= 2 user turns, then
  ``episode_upto`` is set (also when no episode was due).

A model failure happens before any write, so nothing is half-written; the session's
``failures``/``next_attempt_at`` get exponential backoff and a timer re-requests it.
After a crash or restart ``recover()`` re-derives everything from the database:
a committed step is never repeated (optimistic checks on ``compressed_upto`` /
``extracted_upto``), an uncommitted one is redone. The only repeat possible is a
pending write applied just before a crash and not yet deleted: it is applied again,
which FactStore turns into a reinforcement, not a duplicate.

Replicas (and ``ethan chat`` beside ``ethan serve``) share the database: before a job works a
session it claims the session in ``consolidation_claims`` (``JobClaims``: ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, a conditional upsert on SQLite), renewed every third of the claim's
lease while it runs, released at its end. A session claimed elsewhere is looked at again
after a third of the lease (what the other worker's job did not cover is still due); a dead
claimer's claim expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from typing import Any, Awaitable, Callable

from memory.working.consolidator import Consolidator
from memory.leases import JOBS
from storage import is_database_error
from memory.profile.modes import COMPANION
from memory.scope import Scope
from memory.text.similarity import similarity
from memory.sessions.speaker import label as speaker_label
from memory.working.consolidation_state import ACTIONS, AFTER, Outcome, Phase, Plan, StaleWork, phase
from memory.working.consolidation_store import ConsolidationStore, PendingWrite
from memory.working.turns import Turn
from memory.working.view import WorkingMemory

MIN_EPISODE_TURNS = 2
EPISODE_RECENT_TURNS = 20       # latest turns given verbatim to the episode summary
MIN_FACT_IMPORTANCE = 0.3       # below this a fact would never be injected: not kept
CLAIM_SECONDS = 15.0


class JobClaims:
    """One worker per session at a time, across processes: a claim with a lease."""

    def __init__(self, db: Any, owner: str, *, lease_seconds: float = CLAIM_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.owner = owner
        self.lease_seconds = float(lease_seconds)
        self.clock = clock

    async def claim(self, session_id: str) -> bool:
        now = self.clock()
        return await self.db.write(_claim_job, session_id, self.owner, now, now + self.lease_seconds)

    async def release(self, session_id: str) -> None:
        await self.db.write(JOBS.release, session_id, self.owner)

    async def renew(self) -> int:
        return await self.db.write(JOBS.renew, self.owner, self.clock() + self.lease_seconds)


def _claim_job(conn: Any, session_id: str, owner: str, now: float, until: float) -> bool:
    # PostgreSQL: a concurrent claimer skips the locked claim row instead of queueing behind it
    # (the session is looked at again after a third of the lease).
    return JOBS.claim(conn, session_id, owner, now, until, wait=False)


class ConsolidationQueue:
    def __init__(
        self,
        *,
        db: Any,
        sessions: Any,
        working: WorkingMemory,
        facts: Any,
        profile: Any,
        episodes: Any,
        modes: Any,
        consolidator: Consolidator,
        workers: int = 2,
        log: Any = None,
        backoff_base: float = 30.0,
        backoff_max: float = 3600.0,
        max_steps: int = 50,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self.db = db
        self.sessions = sessions
        self.working = working
        self.store = ConsolidationStore(db, working.config)    # the progress: read and advanced there
        self.facts = facts
        self.profile = profile
        self.episodes = episodes
        self.modes = modes
        self.consolidator = consolidator
        self.workers = max(1, int(workers))
        self.log = log if log is not None else logging.getLogger("ethan.consolidation")
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_steps = max_steps
        self.clock = clock
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._running: set[str] = set()
        self._rerun: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self._counts: dict[str, int] = defaultdict(int)
        if owner is None:
            from memory.leases import default_replica_id
            owner = default_replica_id()
        self.claims = JobClaims(db, owner, lease_seconds=claim_seconds, clock=clock)

    # -- the reply path's side: sync, non-blocking ---------------------------------------
    def request(self, session_id: str) -> None:
        """Ask for whatever consolidation is due for the session (coalescing)."""
        if self._stopped or not session_id:
            return
        self._counts["requests"] += 1
        if session_id in self._running:
            self._rerun.add(session_id)
            return
        if session_id in self._queued:
            return
        self._queued.add(session_id)
        self._queue.put_nowait(session_id)

    def request_episode(self, session_info: Any) -> None:
        """A session closed: its episode (and final extraction) is due. Usable as a
        SessionStore close listener; what to do is derived from the database."""
        sid = session_info if isinstance(session_info, str) else getattr(session_info, "id", "")
        self.request(sid)

    @property
    def depth(self) -> int:
        """Sessions queued or being worked on."""
        return len(self._queued | self._running)

    def stats(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "queued": len(self._queued),
            "running": len(self._running),
            "retry_scheduled": len(self._timers),
            "workers": self.workers,
            "model": self.consolidator.model,
            **dict(self._counts),
        }

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._tasks:
            return
        self._stopped = False
        self._tasks = [asyncio.create_task(self._worker(i), name=f"consolidation-{i}")
                       for i in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._renew_claims(), name="consolidation-claims"))

    async def _renew_claims(self) -> None:
        """Keep the claims of running jobs alive (a model call may outlast the lease)."""
        while True:
            await asyncio.sleep(max(0.05, self.claims.lease_seconds / 3))
            if self._running:
                try:
                    await self.claims.renew()
                except Exception as e:  # noqa: BLE001 - the next round tries again
                    self._emit("warning", "consolidation_claim_renew_failed", error=f"{type(e).__name__}: {e}"[:200])

    async def recover(self) -> int:
        """Re-derive pending work from the database (after a start or a crash)."""
        n = 0
        now = self.clock()
        for sid in await self.store.sessions_needing_work():
            state = await self.store.state(sid)
            if state.next_attempt_at > now:
                self._schedule(sid, state.next_attempt_at - now)
            else:
                self.request(sid)
            n += 1
        self._emit("info", "consolidation_recovered", sessions=n)
        return n

    async def drain(self, timeout: float = 10.0) -> bool:
        """Finish queued work within ``timeout``; cancel the rest (it stays derivable from
        the database). Returns True when everything finished."""
        finished = True
        if self._tasks:
            try:
                await asyncio.wait_for(self._queue.join(), timeout)
            except asyncio.TimeoutError:
                finished = False
        left = self.depth          # counted before the cancel: cancelled jobs no longer count
        self._stopped = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if not finished:
            self._emit("warning", "consolidation_drain_timeout", left=left)
        return finished

    async def wait_idle(self, timeout: float = 10.0) -> None:
        """Until nothing is queued or running (backoff timers not included). Tests, CLI."""
        await asyncio.wait_for(self._queue.join(), timeout)

    async def run_once(self, session_id: str) -> None:
        """Do the session's due work now, in the caller's task (tests, CLI)."""
        await self._job(session_id)

    # -- workers -------------------------------------------------------------------------
    async def _worker(self, index: int) -> None:
        while True:
            sid = await self._queue.get()
            self._queued.discard(sid)
            self._running.add(sid)
            try:
                await self._job(sid)
            except asyncio.CancelledError:
                self._running.discard(sid)
                self._queue.task_done()
                raise
            except Exception as e:  # _job handles its own failures; this is a bug guard
                if is_database_error(e):
                    # The database itself is away (PostgreSQL restarting) where _job could not
                    # record the failure: not a bug, and the job is looked at again.
                    self._emit("warning", "consolidation_failed", session_id=sid,
                               error=f"{type(e).__name__}: {e}"[:200], retry_in=self.backoff_base)
                    self._schedule(sid, self.backoff_base)
                else:
                    self._emit("error", "consolidation_worker_error", session_id=sid, exc_info=True)
            self._running.discard(sid)
            if sid in self._rerun:
                self._rerun.discard(sid)
                self.request(sid)
            self._queue.task_done()

    def _schedule(self, sid: str, delay: float) -> None:
        if self._stopped:
            return
        old = self._timers.pop(sid, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._timers.pop(sid, None)
            self.request(sid)

        self._timers[sid] = asyncio.get_running_loop().call_later(max(0.0, delay), fire)

    async def _job(self, sid: str) -> None:
        # One read for what the job looks at first (this runs after every reply, and usually
        # finds nothing due): backoff state, session, pending writes and the due work. What
        # each phase does and what follows each outcome: memory/working/consolidation_state.py.
        plan = await self.store.plan(sid)
        at = phase(plan, self.clock())
        if not ACTIONS[at].claims:
            await WORK[ACTIONS[at].work](self, sid, plan)     # nothing due (most replies) or a backoff: no claim
            return
        if not await self.claims.claim(sid):
            await self._after(sid, at, Outcome.CLAIMED_ELSEWHERE)
            return
        try:
            plan = await self.store.plan(sid)     # derived again under the claim
            await self._claimed_job(sid, plan)
        finally:
            with contextlib.suppress(Exception):    # else it expires by itself
                await self.claims.release(sid)

    async def _claimed_job(self, sid: str, plan: Plan) -> None:
        """Under the claim, phase after phase, each from a fresh plan: the phase's work
        (``ACTIONS``), then what follows it (``AFTER``), until a phase that does not claim (nothing
        more is due), a next that ends the job, or ``max_steps`` steps."""
        at = phase(plan, self.clock())
        steps = 0
        try:
            while True:
                action = ACTIONS[at]
                if not action.claims:
                    await WORK[action.work](self, sid, plan)
                    return
                if action.work == "step":
                    if steps == self.max_steps:     # the rest waits for the next request
                        self._counts["jobs_done"] += 1
                        return
                    steps += 1
                await WORK[action.work](self, sid, plan)
                if not await self._after(sid, at, Outcome.DONE):
                    return
                plan = await self.store.plan(sid)
                at = phase(plan, self.clock())
        except asyncio.CancelledError:
            raise
        except StaleWork as e:
            await self._after(sid, at, Outcome.STALE, e)
        except Exception as e:
            await self._after(sid, at, Outcome.FAILED, e)

    async def _after(self, sid: str, at: Phase, outcome: Outcome, error: BaseException | None = None) -> bool:
        """What follows a claimed phase's outcome (memory/working/consolidation_state.py ``AFTER``, each
        next done by its method in ``NEXT``). True: the job goes on under its claim."""
        return await NEXT[AFTER[(at, outcome)].what](self, sid, error)

    # -- the phases' work (WORK) -----------------------------------------------------------
    async def _defer(self, sid: str, plan: Plan) -> None:
        if sid not in self._timers:
            self._schedule(sid, plan.state.next_attempt_at - self.clock())
        self._counts["deferred"] += 1

    async def _settle(self, sid: str, plan: Plan) -> None:
        self._counts["jobs_done"] += 1

    # -- what follows an outcome (NEXT) ----------------------------------------------------
    async def _finish(self, sid: str, error: BaseException | None) -> bool:
        self._counts["jobs_done"] += 1
        return False

    async def _rederive(self, sid: str, error: BaseException | None) -> bool:
        return True

    async def _retry_after_lease_third(self, sid: str, error: BaseException | None) -> bool:
        # Another worker (replica) has it: what its job does not cover is looked at again.
        self._counts["claimed_elsewhere"] += 1
        self._emit("info", "consolidation_claimed_elsewhere", session_id=sid)
        self._schedule(sid, self.claims.lease_seconds / 3)
        return False

    async def _rerun_stale(self, sid: str, error: BaseException | None) -> bool:
        # someone else (another process) did it; derive again
        self._counts["stale"] += 1
        self._emit("info", "consolidation_stale", session_id=sid, detail=str(error))
        self._rerun.add(sid) if sid in self._running else self.request(sid)
        return False

    async def _backoff(self, sid: str, error: BaseException | None) -> bool:
        self._counts["failures"] += 1
        delay = await self.store.record_failure(
            sid, f"{type(error).__name__}: {error}", base=self.backoff_base, cap_s=self.backoff_max,
            now=self.clock(),
        )
        self._emit("warning", "consolidation_failed", session_id=sid, error=f"{type(error).__name__}: {error}",
                   retry_in=round(delay, 3))
        self._schedule(sid, delay)
        return False

    # -- steps ---------------------------------------------------------------------------
    async def _step(self, sid: str, plan: Plan) -> None:
        work, meta = plan.work, plan.meta
        inputs = await self.store.step_inputs(work)      # one read for the step's inputs
        state, turns, warm = inputs.state, inputs.turns, inputs.warm
        if work.kind == "compress":
            previous = warm[-1].summary if warm else state.rolling_summary
            summary = await self.consolidator.compress(turns, previous_summary=previous)
            first = turns[0].first_id if turns else work.after_id + 1
            await self.store.commit_compression(work, summary, model=self.consolidator.model, first_msg_id=first)
            self._counts["compressions"] += 1
            self._emit("info", "warm_compressed", session_id=work.session_id, turns=work.turns,
                       upto=work.upto_id)
            return
        # extract + fold
        after, upto = inputs.after_id, inputs.upto_id
        writes = await self._extraction_writes(meta, turns)
        rolling = state.rolling_summary
        if warm:
            rolling = await self.consolidator.fold(state.rolling_summary, [w.summary for w in warm])
        await self.store.commit_extraction(
            work.session_id, after_id=after, upto_id=upto, writes=writes,
            rolling_summary=rolling, fold_upto=work.upto_id,
        )
        self._counts["extractions"] += 1
        self._emit("info", "cold_extracted", session_id=work.session_id, writes=len(writes), folded=len(warm))

    async def _episode(self, sid: str, plan: Plan) -> None:
        meta = plan.meta
        state = await self.store.state(sid)
        last = await self.working.last_message(sid)
        if last is None or last.id <= state.episode_upto:
            return
        # 1. facts from the turns no extraction has read yet
        if last.id > state.extracted_upto:
            turns = await self.working.turns(sid, state.extracted_upto, last.id)
            writes = await self._extraction_writes(meta, turns)
            await self.store.commit_extraction(
                sid, after_id=state.extracted_upto, upto_id=last.id, writes=writes,
            )
            await self._apply_writes(sid)
            self._counts["final_extractions"] += 1
            state = await self.store.state(sid)
        # 2. one episode per participating user with >= 2 user turns
        participants = await self._participants(sid)
        due = [(uid, n) for uid, n in participants if n >= MIN_EPISODE_TURNS]
        if due:
            warm = await self.working.warm(sid)
            background = "\n\n".join(
                s for s in [state.rolling_summary.strip(), *(w.summary.strip() for w in warm)] if s
            )
            recent = await self.working.hot_turns(
                sid, before_message_id=last.id + 1, state=state, limit=EPISODE_RECENT_TURNS
            )
            summary = await self.consolidator.summarize_episode(background, recent)
            lines, started, ended = await self._said(sid, last.id)
            for uid, n in due:
                await self.episodes.write(
                    session_id=sid, user_id=uid, chat_id=meta.chat_id, chat_type=meta.chat_type,
                    summary=summary, turn_count=n, model=self.consolidator.model,
                    turns=lines, started_at=started, ended_at=ended,
                )
                self._counts["episodes"] += 1
        await self.store.mark_episode(sid, last.id)
        self._emit("info", "episode_done", session_id=sid, episodes=len(due))

    async def _said(self, sid: str, upto: int) -> tuple[list[str], float | None, float | None]:
        """What the users said in the session (the episode indexes it beside the summary) and
        the session's first and last message times.

        Only user lines: an assistant answer restates memory injected from *other* sessions,
        which would make this episode match their topics."""
        rows = await self.db.fetchall(
            "SELECT content, sender_name FROM messages WHERE session_id = ? AND role = 'user'"
            " AND tool_call_id IS NULL AND id <= ? ORDER BY id", (sid, upto))
        span = await self.db.fetchone(
            "SELECT MIN(created_at) AS a, MAX(created_at) AS b FROM messages WHERE session_id = ?", (sid,))
        lines = [speaker_label(r["content"], r["sender_name"]) if r["sender_name"] else r["content"]
                 for r in rows if (r["content"] or "").strip()]
        return lines, (span["a"] if span else None), (span["b"] if span else None)

    async def _participants(self, sid: str) -> list[tuple[str, int]]:
        rows = await self.db.fetchall(
            "SELECT sender_id, COUNT(*) AS n FROM messages WHERE session_id = ? AND role = 'user'"
            " AND tool_call_id IS NULL AND sender_id <> '' GROUP BY sender_id ORDER BY MIN(id)",
            (sid,),
        )
        return [(r["sender_id"], int(r["n"])) for r in rows]

    async def _extraction_writes(self, meta: Any, turns: list[Turn]) -> list[tuple[str, str, dict[str, Any]]]:
        """Model calls for every speaking user; returns the writes to record (no DB writes)."""
        by_user: dict[str, list[Turn]] = {}
        for t in turns:
            if t.user is not None and t.sender_id and t.user_text.strip():
                by_user.setdefault(t.sender_id, []).append(t)
        writes: list[tuple[str, str, dict[str, Any]]] = []
        for uid, own in by_user.items():
            companion = (await self.modes.get(uid, meta.conv_key)) == COMPANION
            said = [t.user_text for t in own]
            existing = await self.facts.similar(uid, said)
            extraction = await self.consolidator.extract(said, companion=companion, existing=existing)
            if extraction.skipped_secrets:
                self._counts["secrets_skipped"] += extraction.skipped_secrets
            where = {
                "chat_id": meta.chat_id, "chat_type": meta.chat_type, "thread_id": meta.thread_id,
                "message_id": next((t.user.lark_message_id for t in reversed(own)
                                    if t.user and t.user.lark_message_id), ""),
            }
            for fact in extraction.facts:
                if fact.importance < MIN_FACT_IMPORTANCE:
                    continue
                writes.append(("fact", uid, {
                    **where, "content": fact.content, "category": fact.category,
                    "importance": round(fact.importance, 3),
                    # the user's line the fact most likely came from: FactStore raises the
                    # confidence for strong signals in it (记住 / remember / 纠正 …)
                    "user_text": _source_line(fact.content, [t.user_text for t in own]),
                    "action": fact.action, "target_id": fact.target_id,
                }))
            if companion and extraction.profile_psych:
                writes.append(("psych", uid, {**where, "entries": extraction.profile_psych}))
        return writes

    async def _apply_writes(self, sid: str, plan: Plan | None = None) -> None:
        """Apply the pending writes (those of ``plan``, already read, or read now)."""
        pending: list[PendingWrite] = plan.writes if plan is not None else await self.store.pending_writes(sid)
        for wid, kind, uid, payload in pending:
            scope = Scope(
                user_id=uid, chat_id=payload.get("chat_id", ""), chat_type=payload.get("chat_type", ""),
                thread_id=payload.get("thread_id", ""), message_id=payload.get("message_id", ""),
            )
            if kind == "fact":
                try:
                    await self.facts.add(
                        scope, payload["content"], payload["category"], source="consolidator",
                        importance=payload.get("importance"), user_text=payload.get("user_text", ""),
                        session_id=sid, decision=(payload.get("action") or "add", payload.get("target_id")),
                    )
                    self._counts["facts_written"] += 1
                except ValueError as e:     # FactStore refuses secrets and bad input: skip it
                    self._counts["facts_refused"] += 1
                    self._emit("info", "fact_refused", session_id=sid, reason=str(e)[:200])
            elif kind == "psych":
                if (await self.modes.get(uid, scope.conv_key)) == COMPANION:
                    try:
                        n = await self.profile.apply_extraction(scope, payload["entries"], companion=True,
                                                                  session_id=sid)
                        self._counts["psych_written"] += int(n or 0)
                    except ValueError as e:  # ProfileError is a ValueError
                        self._emit("info", "psych_refused", session_id=sid, reason=str(e)[:200])
            await self.store.done_write(wid)

    # -- logging -------------------------------------------------------------------------
    def _emit(self, level: str, event: str, **fields: Any) -> None:
        log = self.log
        exc_info = fields.pop("exc_info", False)
        if isinstance(log, logging.Logger):
            detail = " ".join(f"{k}={v}" for k, v in fields.items())
            getattr(log, level)(f"{event} {detail}".strip(), exc_info=exc_info)
        else:
            try:
                getattr(log, level)(event, exc_info=exc_info, **fields)
            except Exception:
                pass


# The queue's method for each name the state machine's tables use (ACTIONS[phase].work,
# AFTER[(phase, outcome)].what): tests/memory/test_consolidation_state.py checks both complete.
WORK: dict[str, Callable[[ConsolidationQueue, str, Plan], Awaitable[None]]] = {
    "defer": ConsolidationQueue._defer,
    "settle": ConsolidationQueue._settle,
    "apply_writes": ConsolidationQueue._apply_writes,
    "episode": ConsolidationQueue._episode,
    "step": ConsolidationQueue._step,
}
NEXT: dict[str, Callable[[ConsolidationQueue, str, BaseException | None], Awaitable[bool]]] = {
    "finish": ConsolidationQueue._finish,
    "rederive": ConsolidationQueue._rederive,
    "retry_after_lease_third": ConsolidationQueue._retry_after_lease_third,
    "rerun": ConsolidationQueue._rerun_stale,
    "backoff": ConsolidationQueue._backoff,
}


def _source_line(fact: str, lines: list[str]) -> str:
    """The user line most similar to the fact (bigram Dice), capped."""
    if not lines:
        return ""
    best = max(lines, key=lambda line: similarity(fact, line))
    return best[:1000]
