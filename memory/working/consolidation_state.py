"""Consolidation's state machine, in one module: a session's progress record, what is due next,
and what a job does in each phase and after each outcome (pure: no database).

The record (``consolidation_state``, one row per session) is :class:`State`; every statement
that reads or advances it is memory/working/consolidation_store.py's. A job
(memory/working/consolidation_queue.py) reads a :class:`Plan` in one round trip, classifies it with
:func:`phase`, and does the work :data:`ACTIONS` names for that phase; how it ends
(:class:`Outcome`) names what happens next (:data:`AFTER`). The queue maps each name to its
method (``consolidation_queue.WORK``, ``consolidation_queue.NEXT``). The tables are checked
complete by tests/memory/test_consolidation_state.py (every phase has an action, every phase
that claims has an entry for every outcome, :func:`phase` reaches every phase, and the queue
has a method for every work and every next the tables name).

Progress only moves forward, one committed step at a time:

- **compress** (``compressed_upto``): the oldest ``compress_batch`` complete uncompressed turns
  become one warm summary, once ``hot_size + compress_batch`` complete turns are uncompressed;
- **extract** (``extracted_upto``; ``warm_turns`` back to 0): once warm has absorbed
  ``warm_capacity`` turns, facts from them, then the warm rows fold into ``rolling_summary``;
- **episode** (``episode_upto``): a closed session's remaining turns extracted, then its episode;
- a recorded extraction's **pending writes** (``consolidation_writes``) are applied before
  anything else;
- a **failure** sets ``failures`` / ``next_attempt_at`` (exponential backoff): nothing is due
  before that time.

Every commit checks the progress it started from (``StaleWork`` when another worker moved it),
so a stale or duplicated job never does a step twice.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class StaleWork(RuntimeError):
    """The recorded progress moved since the work was derived (another worker did it)."""


@dataclass(frozen=True, slots=True)
class State:
    compressed_upto: int = 0
    extracted_upto: int = 0
    rolling_summary: str = ""
    warm_turns: int = 0
    episode_upto: int = 0
    failures: int = 0
    next_attempt_at: float = 0.0
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class Work:
    """Consolidation due for a session: messages in (after_id, upto_id]."""

    session_id: str
    kind: str           # "compress" | "extract"
    after_id: int
    upto_id: int
    turns: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What a consolidation job starts from (``ConsolidationStore.plan``)."""

    state: State
    meta: Any                   # memory.working.turns.SessionMeta | None (None: the session is gone)
    writes: list[tuple[int, str, str, dict[str, Any]]]   # pending consolidation_writes
    work: Work | None           # due(); None when nothing is due or the session is gone


class Phase(enum.Enum):
    BACKING_OFF = "backing_off"        # the last attempt failed; nothing before next_attempt_at
    GONE = "gone"                      # the session was deleted
    PENDING_WRITES = "pending_writes"  # an extraction's results recorded, not yet applied
    EPISODE = "episode"                # closed: the remaining turns' facts, then the episode
    EXTRACT = "extract"                # warm is full: facts, then the fold
    COMPRESS = "compress"              # enough complete turns: the oldest batch to warm
    SETTLED = "settled"                # nothing due (the usual case after a reply)


class Outcome(enum.Enum):
    DONE = "done"                          # the phase's work committed (or there was none)
    CLAIMED_ELSEWHERE = "claimed_elsewhere"   # another worker (replica) holds the session
    STALE = "stale"                        # StaleWork: the progress moved under this job
    FAILED = "failed"                      # a model or database error, before any write


@dataclass(frozen=True, slots=True)
class Action:
    claims: bool        # the session is claimed (memory/leases.py JOBS) for the work
    work: str           # the queue's method for it (consolidation_queue.WORK)
    does: str           # what that is, in words


@dataclass(frozen=True, slots=True)
class Next:
    what: str           # "finish" | "rederive" | "retry_after_lease_third" | "rerun" | "backoff"
    why: str


# A phase that does not claim ends the job (also one found under a claim: nothing more is due).
ACTIONS: dict[Phase, Action] = {
    Phase.BACKING_OFF: Action(False, "defer", "schedule a request at next_attempt_at"),
    Phase.GONE: Action(False, "settle", "nothing"),
    Phase.SETTLED: Action(False, "settle", "nothing"),
    Phase.PENDING_WRITES: Action(True, "apply_writes", "apply the pending writes, then derive again"),
    Phase.EPISODE: Action(True, "episode", "final extraction of unread turns, then one episode per participant"),
    Phase.EXTRACT: Action(True, "step", "extract facts per speaker, fold warm into the rolling summary"),
    Phase.COMPRESS: Action(True, "step", "compress the oldest batch of complete turns into one warm row"),
}

_CLAIMED = {
    Outcome.DONE: Next("rederive", "more may be due: steps continue up to max_steps, each from a fresh plan"),
    Outcome.CLAIMED_ELSEWHERE: Next("retry_after_lease_third",
                                    "what the other worker's job does not cover is still due"),
    Outcome.STALE: Next("rerun", "another worker moved the progress: derive again from the database"),
    Outcome.FAILED: Next("backoff", "failures += 1, next_attempt_at = now + min(cap, base * 2**(failures-1))"),
}
AFTER: dict[tuple[Phase, Outcome], Next] = {
    (p, o): (Next("finish", "an episode is written once per close") if p is Phase.EPISODE
             and o is Outcome.DONE else n)
    for p, a in ACTIONS.items() if a.claims for o, n in _CLAIMED.items()
}


def phase(plan: Plan, now: float) -> Phase:
    """The phase a job finds the session in (the order is the order the queue checks)."""
    if plan.state.next_attempt_at > now:
        return Phase.BACKING_OFF
    if plan.meta is None:
        return Phase.GONE
    if plan.writes:
        return Phase.PENDING_WRITES
    if plan.meta.closed_at is not None:
        return Phase.EPISODE
    if plan.work is None:
        return Phase.SETTLED
    return Phase.EXTRACT if plan.work.kind == "extract" else Phase.COMPRESS


def due_kind(state: State, *, warm_capacity: int, complete_turns: int, threshold: int) -> str | None:
    """What step is due from the record and the count of complete uncompressed turns (at most
    ``threshold + 1`` counted): "extract" once warm is full, "compress" once ``threshold`` turns
    (``hot_size + compress_batch``) are complete, else None."""
    if state.warm_turns >= warm_capacity:
        return "extract"
    return "compress" if complete_turns >= threshold else None
