"""Where consolidation's progress is read and advanced: every statement over a session's
``consolidation_state`` record, its pending ``consolidation_writes``, and the warm-row commits.

The machine these rows make — the record (:class:`~memory.working.consolidation_state.State`), what is
due, the job's phases and what follows each outcome — is memory/working/consolidation_state.py (pure);
the job that drives it is memory/working/consolidation_queue.py; the rows it reads beside the record
(turns, unfolded warm rows, the session) are memory/working/turns.py's, shared with the working-memory
view (memory/working/view.py), which reads the record through :func:`read_state`.

Reads are one ``Database.read`` each (``plan``: everything a job looks at first, in one round
trip), bounded and indexed (``messages_session(session_id, id)`` with a LIMIT: the session is
never loaded whole). Each write is one ``Database.write`` transaction; a commit locks the
session's record (``FOR UPDATE`` on PostgreSQL) and checks the progress it started from, so a
stale or duplicated job raises ``StaleWork`` instead of compressing or extracting twice.
Nothing here calls a model.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

from memory.working.consolidation_state import Plan, StaleWork, State, Work, due_kind
from memory.working.turns import (MemoryConfig, SessionMeta, Turn, WarmSummary, read_last_message, read_turns,
                          read_warm, session_meta)
from storage import Connection, Database, for_update

PendingWrite = tuple[int, str, str, dict[str, Any]]     # (id, kind, user_id, payload)


@dataclass(frozen=True, slots=True)
class StepInputs:
    state: State
    after_id: int               # turns are the messages in (after_id, upto_id]
    upto_id: int
    turns: list[Turn]
    warm: list[WarmSummary]


class ConsolidationStore:
    def __init__(self, db: Database, config: MemoryConfig | None = None) -> None:
        self.db = db
        self.config = config or MemoryConfig()

    # -- reads ---------------------------------------------------------------------------
    async def state(self, session_id: str) -> State:
        return await self.db.read(read_state, session_id)

    async def due(self, session_id: str) -> Work | None:
        """The step due now (compress or extract), from the record and the complete turns."""
        return await self.db.read(_due, session_id, self.config)

    async def plan(self, session_id: str) -> Plan:
        """Everything a consolidation job looks at first (state, session, pending writes,
        due work), from one read: after most replies nothing is due, and this is all it costs."""
        return await self.db.read(_plan, session_id, self.config)

    async def step_inputs(self, work: Work) -> StepInputs:
        """What a consolidation step reads before its model calls, from one read: for
        "compress" the work's turns and all unfolded warm rows; for "extract" the turns after
        the current ``extracted_upto`` (up to the work's end) and the warm rows it folds."""
        return await self.db.read(_step_inputs, work)

    async def pending_writes(self, session_id: str) -> list[PendingWrite]:
        return await self.db.read(_pending_writes, session_id)

    async def sessions_needing_work(self) -> list[str]:
        """Sessions that may have consolidation, pending writes or an episode due (superset;
        the queue re-derives exactly what with ``plan``)."""
        rows = await self.db.fetchall(
            """
            SELECT s.id FROM sessions s
            LEFT JOIN consolidation_state c ON c.session_id = s.id
            WHERE (s.closed_at IS NULL AND EXISTS (
                      SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.id > COALESCE(c.compressed_upto, 0)))
               OR (COALESCE(c.warm_turns, 0) > 0)
               OR (s.closed_at IS NOT NULL AND EXISTS (
                      SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.id > COALESCE(c.episode_upto, 0)))
               OR EXISTS (SELECT 1 FROM consolidation_writes w WHERE w.session_id = s.id)
            ORDER BY s.updated_at
            """
        )
        return [r["id"] for r in rows]

    # -- advancing the record (one transaction each) --------------------------------------
    async def commit_compression(self, work: Work, summary: str, *, model: str, first_msg_id: int) -> None:
        """The warm row for ``work`` and ``compressed_upto`` / ``warm_turns`` moved past it."""
        await self.db.write(_commit_compression, work, summary, model, first_msg_id, time.time())

    async def commit_extraction(
        self,
        session_id: str,
        *,
        after_id: int,
        upto_id: int,
        writes: Sequence[tuple[str, str, dict[str, Any]]],
        rolling_summary: str | None = None,
        fold_upto: int | None = None,
        reset_warm: bool = True,
    ) -> None:
        """Record an extraction: pending writes + extracted_upto (+ optional fold), atomically.

        ``writes`` are (kind, user_id, payload) rows applied afterwards by the queue.
        With ``rolling_summary``, warm rows ending at or before ``fold_upto`` are marked
        folded and the rolling summary replaced.
        """
        rows = [(kind, user_id, json.dumps(payload, ensure_ascii=False)) for kind, user_id, payload in writes]
        await self.db.write(_commit_extraction, session_id, after_id, upto_id, rows, rolling_summary,
                            fold_upto, reset_warm, time.time())

    async def done_write(self, write_id: int) -> None:
        await self.db.write(_done_write, write_id)

    async def mark_episode(self, session_id: str, upto_id: int) -> None:
        await self.db.write(_mark_episode, session_id, upto_id, time.time())

    async def record_failure(self, session_id: str, error: str, *, base: float, cap_s: float,
                             now: float | None = None) -> float:
        """failures += 1, next_attempt_at = now + min(cap, base * 2**(failures-1)); returns the delay."""
        now = time.time() if now is None else now
        return await self.db.write(_record_failure, session_id, error, base, cap_s, now)


# -- plain functions run in a unit of work (Database.read / Database.write) -----------------

_STATE_COLS = ("compressed_upto", "extracted_upto", "rolling_summary", "warm_turns", "episode_upto",
               "failures", "next_attempt_at", "last_error")
# The session's row and its record in one statement (most units that read one read both):
# the record's columns are NULL when consolidation never ran for it.
_HEAD_SQL = ("SELECT s.id, s.conv_key, s.chat_id, s.thread_id, s.chat_type, s.closed_at, "
             + ", ".join(f"c.{c}" for c in _STATE_COLS) + ", c.session_id AS state_of{extra}"
             " FROM sessions s LEFT JOIN consolidation_state c ON c.session_id = s.id WHERE s.id = ?")
_STATE_AND_META_SQL = _HEAD_SQL.format(extra="")
# A plan's head also says what else it must read: the session's last message id (is the newest
# turn still being answered?) and whether writes are pending.
_PLAN_HEAD_SQL = _HEAD_SQL.format(
    extra=", (SELECT MAX(m.id) FROM messages m WHERE m.session_id = s.id) AS last_id,"
          " EXISTS (SELECT 1 FROM consolidation_writes w WHERE w.session_id = s.id) AS has_writes")


def read_state(conn: Connection, session_id: str) -> State:
    """The session's record (the defaults when consolidation never ran for it)."""
    row = conn.execute(
        "SELECT " + ", ".join(_STATE_COLS) + " FROM consolidation_state WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    return State() if row is None else _state(row)


def _state(row: Any) -> State:
    return State(
        compressed_upto=row["compressed_upto"],
        extracted_upto=row["extracted_upto"],
        rolling_summary=row["rolling_summary"],
        warm_turns=row["warm_turns"],
        episode_upto=row["episode_upto"],
        failures=row["failures"],
        next_attempt_at=row["next_attempt_at"],
        last_error=row["last_error"],
    )


def _head(row: Any) -> tuple[State, SessionMeta]:
    state = State() if row["state_of"] is None else _state(row)
    return state, session_meta(row)


def read_state_and_meta(conn: Connection, session_id: str) -> tuple[State, SessionMeta | None]:
    """``read_state`` and ``read_meta`` in one statement (no session row: the record alone, in
    a second statement, and None)."""
    row = conn.execute(_STATE_AND_META_SQL, (session_id,)).fetchone()
    if row is None:
        return read_state(conn, session_id), None
    return _head(row)


def _user_ids_asc(conn: Connection, session_id: str, after_id: int, limit: int) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM messages WHERE session_id = ? AND id > ? AND role = 'user'"
        " AND tool_call_id IS NULL ORDER BY id LIMIT ?",
        (session_id, after_id, limit),
    ).fetchall()
    return [r["id"] for r in rows]


def _due(conn: Connection, session_id: str, cfg: MemoryConfig, state: State | None = None, *,
         last_id: int | None = None) -> Work | None:
    """``last_id``: the session's last message id, when the caller read it already."""
    state = state or read_state(conn, session_id)
    threshold = cfg.hot_size + cfg.compress_batch
    ids: list[int] = []
    complete = 0
    if state.warm_turns < cfg.warm_capacity:      # only a compression needs the turns counted
        ids = _user_ids_asc(conn, session_id, state.compressed_upto, threshold + 1)
        complete = len(ids)
        if complete <= threshold and ids:
            if last_id is None:
                last = read_last_message(conn, session_id)
                last_id = last.id if last is not None else None
            if last_id == ids[-1]:
                complete -= 1           # the bot is still answering it
    kind = due_kind(state, warm_capacity=cfg.warm_capacity, complete_turns=complete, threshold=threshold)
    if kind == "extract":
        return Work(session_id, "extract", state.extracted_upto, state.compressed_upto, state.warm_turns)
    if kind is None:
        return None
    next_user = ids[cfg.compress_batch]
    row = conn.execute(
        "SELECT MAX(id) AS m FROM messages WHERE session_id = ? AND id < ?", (session_id, next_user)
    ).fetchone()
    return Work(session_id, "compress", state.compressed_upto, int(row["m"]), cfg.compress_batch)


def _step_inputs(conn: Connection, work: Work) -> StepInputs:
    state = read_state(conn, work.session_id)
    if work.kind == "compress":
        after, upto, warm_upto = work.after_id, work.upto_id, None
    else:
        after = state.extracted_upto
        upto, warm_upto = max(work.upto_id, after), work.upto_id
    turns = read_turns(conn, work.session_id, after, upto + 1) if upto > after else []
    return StepInputs(state, after, upto, turns, read_warm(conn, work.session_id, warm_upto))


def _plan(conn: Connection, session_id: str, cfg: MemoryConfig) -> Plan:
    # After every reply: one statement says most of it (the usual answer is "nothing due").
    row = conn.execute(_PLAN_HEAD_SQL, (session_id,)).fetchone()
    if row is None:     # the session is gone: its record and writes, if any are left
        return Plan(read_state(conn, session_id), None, _pending_writes(conn, session_id), None)
    state, meta = _head(row)
    work = _due(conn, session_id, cfg, state, last_id=row["last_id"])
    return Plan(state, meta, _pending_writes(conn, session_id) if row["has_writes"] else [], work)


def _pending_writes(conn: Connection, session_id: str) -> list[PendingWrite]:
    rows = conn.execute(
        "SELECT id, kind, user_id, payload FROM consolidation_writes WHERE session_id = ? ORDER BY id",
        (session_id,),
    ).fetchall()
    return [(r["id"], r["kind"], r["user_id"], json.loads(r["payload"])) for r in rows]


def _ensure_state(conn: Connection, session_id: str, now: float) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO consolidation_state(session_id, updated_at) VALUES (?, ?)", (session_id, now)
    )


def _commit_compression(conn: Connection, work: Work, summary: str, model: str, first_msg_id: int,
                        now: float) -> None:
    _ensure_state(conn, work.session_id, now)
    row = conn.execute(   # locked: a concurrent commit of the same step waits, then sees it moved
        "SELECT compressed_upto FROM consolidation_state WHERE session_id = ?" + for_update(conn), (work.session_id,)
    ).fetchone()
    if row["compressed_upto"] != work.after_id:
        raise StaleWork(f"{work.session_id}: compressed_upto moved to {row['compressed_upto']}")
    conn.execute(
        "INSERT INTO warm_summaries(session_id, first_msg_id, last_msg_id, turns, summary, model,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (work.session_id, first_msg_id, work.upto_id, work.turns, summary, model, now),
    )
    conn.execute(
        "UPDATE consolidation_state SET compressed_upto = ?, warm_turns = warm_turns + ?,"
        " failures = 0, next_attempt_at = 0, last_error = '', updated_at = ? WHERE session_id = ?",
        (work.upto_id, work.turns, now, work.session_id),
    )


def _commit_extraction(conn: Connection, session_id: str, after_id: int, upto_id: int,
                       rows: list[tuple[str, str, str]], rolling_summary: str | None, fold_upto: int | None,
                       reset_warm: bool, now: float) -> None:
    _ensure_state(conn, session_id, now)
    row = conn.execute("SELECT extracted_upto FROM consolidation_state WHERE session_id = ?" + for_update(conn),
                       (session_id,)).fetchone()
    if row["extracted_upto"] != after_id:
        raise StaleWork(f"{session_id}: extracted_upto moved to {row['extracted_upto']}")
    conn.executemany(
        "INSERT INTO consolidation_writes(session_id, kind, user_id, payload, created_at) VALUES (?, ?, ?, ?, ?)",
        [(session_id, kind, user_id, payload, now) for kind, user_id, payload in rows],
    )
    if rolling_summary is not None:
        conn.execute(
            "UPDATE warm_summaries SET folded = 1 WHERE session_id = ? AND folded = 0 AND last_msg_id <= ?",
            (session_id, fold_upto if fold_upto is not None else upto_id),
        )
        conn.execute(
            "UPDATE consolidation_state SET rolling_summary = ? WHERE session_id = ?", (rolling_summary, session_id)
        )
    conn.execute(
        "UPDATE consolidation_state SET extracted_upto = MAX(extracted_upto, ?),"
        + (" warm_turns = 0," if reset_warm else "")
        + " failures = 0, next_attempt_at = 0, last_error = '', updated_at = ? WHERE session_id = ?",
        (upto_id, now, session_id),
    )


def _done_write(conn: Connection, write_id: int) -> None:
    conn.execute("DELETE FROM consolidation_writes WHERE id = ?", (write_id,))


def _mark_episode(conn: Connection, session_id: str, upto_id: int, now: float) -> None:
    _ensure_state(conn, session_id, now)
    conn.execute(
        "UPDATE consolidation_state SET episode_upto = MAX(episode_upto, ?), failures = 0,"
        " next_attempt_at = 0, last_error = '', updated_at = ? WHERE session_id = ?",
        (upto_id, now, session_id),
    )


def _record_failure(conn: Connection, session_id: str, error: str, base: float, cap_s: float,
                    now: float) -> float:
    _ensure_state(conn, session_id, now)
    failures = conn.execute(
        "SELECT failures FROM consolidation_state WHERE session_id = ?" + for_update(conn), (session_id,)
    ).fetchone()["failures"] + 1
    delay = min(cap_s, base * (2 ** (failures - 1)))
    conn.execute(
        "UPDATE consolidation_state SET failures = ?, next_attempt_at = ?, last_error = ?,"
        " updated_at = ? WHERE session_id = ?",
        (failures, now + delay, error[:500], now, session_id),
    )
    return delay
