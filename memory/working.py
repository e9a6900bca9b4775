"""Layer 2: the working-memory window over one session's stored messages.

A *turn* is one user message and the assistant message(s) stored after it, up to
the next user message. Per session (``consolidation_state``):

- ``compressed_upto``: last message id folded into a warm summary. Turns after it
  are *uncompressed*, and every one of them is the **hot zone**, replayed verbatim:
  there is never a hole between what the summaries cover and what is replayed
  (DESIGN §4). Normally that is between ``hot_size`` and ``hot_size +
  compress_batch - 1`` turns (the spec's 攒够多少轮再压缩一次).
- Once the *complete* uncompressed turns reach ``hot_size + compress_batch``, the
  oldest ``compress_batch`` turns are compressed into one **warm** row
  (``warm_summaries``). Only complete turns count (a user message the bot is
  still answering is not one), so compression never touches the turns the
  next request replays.
- When consolidation is behind or failing, uncompressed turns pile up: they are
  still replayed verbatim up to ``replay_budget`` (estimated tokens); beyond it the
  oldest are left out with a visible marker (``TRIMMED``) on the first replayed
  message and a ``working.replay_trimmed`` warning — never silently. The newest
  ``hot_size + compress_batch - 1`` turns (the whole window while consolidation
  keeps up) are always replayed whatever the budget.
- ``warm_turns`` counts turns absorbed into warm since the last extraction; once
  it reaches ``warm_capacity``, facts are extracted from those turns
  (``extracted_upto``) and the warm rows fold into ``rolling_summary``.

The consolidation state machine itself — the record, what is due, the job's phases and
transitions — is memory/consolidation_state.py; this module is its store (the SQL).

Reads here are bounded, indexed queries (``messages_session(session_id, id)``
scanned backwards with a LIMIT): the whole session is never loaded. Writes
(``commit_*``) are single ``BEGIN IMMEDIATE`` transactions with an optimistic
check on the recorded progress, so a stale or duplicated job cannot compress
twice. The consolidation queue drives them; nothing here calls a model.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from memory.consolidation_state import Plan, StaleWork, State, Work, due_kind
from memory.speaker import label as speaker_label
from storage import Database, for_update

REPLAY_CAP = 4000                   # chars per replayed stored message
TRUNCATED = "…(truncated)"
# Shown to the model where turns had to be left out (consolidation behind, budget reached).
TRIMMED = "[…更早的 {n} 轮对话未能回放 / {n} earlier turns not shown…]"
MAX_REPLAY_TURNS = 200              # bound of the replay query, whatever the budget
LONG_TERM_TAG = "[长期记忆]"
SUMMARY_TAG = "[对话摘要]"
ACK = "好的。"
GROUP_CHAT_TYPES = frozenset({"group"})
_MAX_ID = 2**63 - 1

log = logging.getLogger("ethan.working")

# The hot window's user messages: messages_session(session_id, id) walked backwards, LIMITed.
HOT_IDS_SQL = (
    "SELECT id FROM messages WHERE session_id = ? AND id > ? AND id < ? AND role = 'user'"
    " AND tool_call_id IS NULL ORDER BY id DESC LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    hot_size: int = 10          # turns always replayed verbatim (more while compression is due)
    compress_batch: int = 5     # turns per warm summary
    warm_capacity: int = 20     # warm turns absorbed before cold extraction + fold
    # Estimated tokens of replayed turns before a backlog (turns beyond hot_size +
    # compress_batch - 1, only there when consolidation is behind) is trimmed from the oldest.
    replay_budget: int = 24_000

    def __post_init__(self) -> None:
        if self.hot_size < 1 or self.compress_batch < 1 or self.warm_capacity < 1 or self.replay_budget < 1:
            raise ValueError("MemoryConfig sizes must be >= 1")


@dataclass(slots=True)
class Message:
    id: int
    role: str
    content: str
    sender_id: str = ""
    sender_name: str = ""
    lark_message_id: str = ""


@dataclass(slots=True)
class Turn:
    """One user message and the assistant answer(s) after it."""

    user: Message | None
    assistant: list[Message] = field(default_factory=list)

    @property
    def first_id(self) -> int:
        return self.user.id if self.user else self.assistant[0].id

    @property
    def last_id(self) -> int:
        return self.assistant[-1].id if self.assistant else self.user.id  # type: ignore[union-attr]

    @property
    def user_text(self) -> str:
        return self.user.content if self.user else ""

    @property
    def assistant_text(self) -> str:
        return "\n\n".join(m.content for m in self.assistant if m.content)

    @property
    def sender_id(self) -> str:
        return self.user.sender_id if self.user else ""

    @property
    def sender_name(self) -> str:
        return self.user.sender_name if self.user else ""

    @property
    def answered(self) -> bool:
        return bool(self.assistant)


@dataclass(frozen=True, slots=True)
class WarmSummary:
    id: int
    first_msg_id: int
    last_msg_id: int
    turns: int
    summary: str
    model: str


@dataclass(frozen=True, slots=True)
class SessionMeta:
    id: str
    conv_key: str
    chat_id: str
    thread_id: str
    chat_type: str
    closed_at: float | None

    @property
    def is_group(self) -> bool:
        return self.chat_type in GROUP_CHAT_TYPES


@dataclass(frozen=True, slots=True)
class ContextView:
    """What the next request would carry, for the console's memory panel."""

    long_term: str              # rolling summary ([长期记忆])
    summary: str                # unfolded warm summaries ([对话摘要])
    hot_turns: list[Turn]       # replayed verbatim (every uncompressed turn, up to the budget)
    pending: int                # uncompressed turns *not* replayed (trimmed: consolidation behind)
    warm_turns: int = 0         # turns absorbed into warm since the last extraction
    warm_rows: int = 0


def cap(text: str, limit: int = REPLAY_CAP) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n" + TRUNCATED


def label(text: str, name: str) -> str:
    return speaker_label(text, name)     # escaped: a member cannot fake another's label (memory/speaker.py)


def estimate_tokens(text: str) -> int:
    """A generous token estimate without a tokenizer: ASCII ~4 characters a token, anything
    else (CJK above all) one token a character. Used for budgets and the prompt-cache
    minimums, where counting high is the safe side."""
    if text.isascii():          # the common case, in C
        return (len(text) + 3) // 4
    # encode(…, "ignore") drops every non-ASCII character: the count in C, not per character
    ascii_chars = len(text.encode("ascii", "ignore"))
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def _turn_tokens(turn: "Turn") -> int:
    n = estimate_tokens(cap(turn.user_text)) if turn.user is not None else 0
    return n + sum(estimate_tokens(cap(a.content)) for a in turn.assistant) + 8


class WorkingMemory:
    def __init__(self, db: Database, sessions: Any = None, config: MemoryConfig | None = None) -> None:
        self.db = db
        self.sessions = sessions
        self.config = config or MemoryConfig()

    # Every read below is one Database.read: its SELECTs run together in the SQLite thread
    # (one round trip), using the plain functions at the end of this module.

    # -- state -------------------------------------------------------------------
    async def state(self, session_id: str) -> State:
        return await self.db.read(_state, session_id)

    async def session(self, session_id: str) -> SessionMeta | None:
        return await self.db.read(_meta, session_id)

    async def warm(self, session_id: str, *, upto_id: int | None = None) -> list[WarmSummary]:
        """Unfolded warm rows in order (optionally only those ending at or before upto_id)."""
        return await self.db.read(_warm, session_id, upto_id)

    async def last_message(self, session_id: str) -> Message | None:
        return await self.db.read(_last_message, session_id)

    # -- reading turns (bounded) ---------------------------------------------------
    async def turns(self, session_id: str, after_id: int, upto_id: int) -> list[Turn]:
        """Turns made of the messages in (after_id, upto_id]."""
        return await self.db.read(_turns_in, session_id, after_id, upto_id + 1)

    async def hot_turns(self, session_id: str, *, before_message_id: int | None = None,
                        state: State | None = None, limit: int | None = None) -> list[Turn]:
        """The last ``limit`` (default ``hot_size``) uncompressed turns before the boundary
        (see ``_hot_turns`` for the boundary)."""
        return await self.db.read(_hot_turns, session_id, before_message_id, state, limit or self.config.hot_size)

    # -- the request context ---------------------------------------------------------
    async def build_context(
        self,
        session_id: str,
        current_input: str | list[dict[str, Any]],
        *,
        before_message_id: int | None = None,
        speaker_name: str = "",
    ) -> list[dict[str, Any]]:
        """Messages in the spec's shape (memory/llm.py ``Message`` dicts):

        ``[长期记忆]`` pair (rolling summary), ``[对话摘要]`` pair (unfolded warm
        summaries: one text block each, so a new summary only appends to what earlier
        requests sent and their cached prefix still matches), every uncompressed turn
        (roles alternating; consecutive same-role messages merged; see the module
        docstring for the budget), then ``current_input``. Pass ``before_message_id`` =
        the stored current message's id (or leave it None when it is the session's last
        message); in group sessions, ``speaker_name`` labels the current input the
        way replayed user messages are labelled (``[Alice] text``).
        """
        snap = await self.db.read(_snapshot, session_id, before_message_id, self.config, False)
        return self._assembled(session_id, snap, current_input, speaker_name)

    async def context_and_view(
        self,
        session_id: str,
        current_input: str | list[dict[str, Any]],
        *,
        before_message_id: int | None = None,
        speaker_name: str = "",
    ) -> tuple[list[dict[str, Any]], ContextView]:
        """``build_context(...)`` and ``view(session_id)`` from one read (the agent needs both
        for every message: one round trip instead of two, and one consistent snapshot)."""
        snap = await self.db.read(_snapshot, session_id, before_message_id, self.config, True)
        return self._assembled(session_id, snap, current_input, speaker_name), snap.view

    def _assembled(self, session_id: str, snap: "_Snapshot", current_input: str | list[dict[str, Any]],
                   speaker_name: str) -> list[dict[str, Any]]:
        if snap.trimmed:
            # Consolidation is behind (or failing) and the backlog outgrew the budget: the model
            # is told, and so is the operator — turns are never dropped silently.
            log.warning("working.replay_trimmed session_id=%s trimmed=%d replayed=%d failures=%d last_error=%s",
                        session_id, snap.trimmed, len(snap.hot), snap.state.failures,
                        snap.state.last_error[:120])
        return _assemble(snap, current_input, speaker_name)

    async def view(self, session_id: str) -> ContextView:
        return await self.db.read(_view, session_id, self.config)

    # -- what consolidation is due (pure read) ------------------------------------------
    async def due(self, session_id: str) -> Work | None:
        return await self.db.read(_due, session_id, self.config)

    async def step_inputs(self, work: Work) -> "StepInputs":
        """What a consolidation step reads before its model calls, from one read: for
        "compress" the work's turns and all unfolded warm rows; for "extract" the turns after
        the current ``extracted_upto`` (up to the work's end) and the warm rows it folds."""
        return await self.db.read(_step_inputs, work)

    async def plan(self, session_id: str) -> "Plan":
        """Everything a consolidation job looks at first (state, session, pending writes,
        due work), from one read: after most replies nothing is due, and this is all it costs."""
        return await self.db.read(_plan, session_id, self.config)

    async def unextracted(self, session_id: str) -> tuple[int, int] | None:
        """(extracted_upto, last message id) when messages after extracted_upto exist."""
        return await self.db.read(_unextracted, session_id)

    # -- committing consolidation (one transaction each) ---------------------------------
    async def commit_compression(self, work: Work, summary: str, *, model: str, first_msg_id: int) -> None:
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

    async def pending_writes(self, session_id: str) -> list[tuple[int, str, str, dict[str, Any]]]:
        return await self.db.read(_pending_writes, session_id)

    async def done_write(self, write_id: int) -> None:
        await self.db.write(_done_write, write_id)

    async def mark_episode(self, session_id: str, upto_id: int) -> None:
        await self.db.write(_mark_episode, session_id, upto_id, time.time())

    async def record_failure(self, session_id: str, error: str, *, base: float, cap_s: float,
                             now: float | None = None) -> float:
        """failures += 1, next_attempt_at = now + min(cap, base * 2**(failures-1)); returns the delay."""
        now = time.time() if now is None else now
        return await self.db.write(_record_failure, session_id, error, base, cap_s, now)

    # -- recovery ------------------------------------------------------------------------------
    async def sessions_needing_work(self) -> list[str]:
        """Sessions that may have consolidation, pending writes or an episode due (superset;
        the queue re-derives exactly what with ``due``)."""
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


def _message(row: Any) -> Message:
    return Message(
        id=row["id"], role=row["role"], content=row["content"] or "",
        sender_id=row["sender_id"] or "", sender_name=row["sender_name"] or "",
        lark_message_id=row["lark_message_id"] or "",
    )


def _push(messages: list[dict[str, Any]], role: str, content: str | list[dict[str, Any]]) -> None:
    """Append, merging with the previous message when it has the same role."""
    if messages and messages[-1]["role"] == role:
        prev = messages[-1]["content"]
        if isinstance(prev, str) and isinstance(content, str):
            messages[-1]["content"] = prev + "\n\n" + content
        else:
            messages[-1]["content"] = _blocks(prev) + _blocks(content)
        return
    messages.append({"role": role, "content": content})


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _label_input(content: str | list[dict[str, Any]], name: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return label(content, name)
    blocks = list(content)
    for i, b in enumerate(blocks):
        if b.get("type") == "text":
            blocks[i] = {**b, "text": label(b.get("text", ""), name)}
            return blocks
    return [{"type": "text", "text": speaker_label("", name).rstrip()}] + blocks


@dataclass(frozen=True, slots=True)
class StepInputs:
    state: State
    after_id: int               # turns are the messages in (after_id, upto_id]
    upto_id: int
    turns: list[Turn]
    warm: list[WarmSummary]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    state: State
    group: bool
    warm: list[WarmSummary]
    hot: list[Turn]
    view: ContextView | None
    trimmed: int = 0            # uncompressed turns left out (over the replay budget)


def _assemble(snap: _Snapshot, current_input: str | list[dict[str, Any]], speaker_name: str) -> list[dict[str, Any]]:
    """The request's messages from a snapshot (build_context's shape; no database access)."""
    state, group = snap.state, snap.group
    messages: list[dict[str, Any]] = []
    if state.rolling_summary.strip():
        messages += [
            {"role": "user", "content": f"{LONG_TERM_TAG}\n{state.rolling_summary.strip()}"},
            {"role": "assistant", "content": ACK},
        ]
    summaries = [w.summary.strip() for w in snap.warm if w.summary.strip()]
    if summaries:
        # One block per warm row (appending a row keeps the earlier blocks' bytes, so the
        # prompt cache still matches up to them); a single row stays a plain string.
        first = f"{SUMMARY_TAG}\n{summaries[0]}"
        content: str | list[dict[str, Any]] = first if len(summaries) == 1 else (
            [{"type": "text", "text": first}] + [{"type": "text", "text": s} for s in summaries[1:]])
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": ACK}]
    marker = TRIMMED.format(n=snap.trimmed) if snap.trimmed else ""
    for turn in snap.hot:
        if marker:
            _push(messages, "user", marker)
            marker = ""
        if turn.user is not None and turn.user.content:
            text = cap(turn.user.content)
            _push(messages, "user", label(text, turn.sender_name or turn.sender_id) if group else text)
        for a in turn.assistant:
            if a.content:
                _push(messages, "assistant", cap(a.content))
    current: str | list[dict[str, Any]] = current_input
    if group and speaker_name:
        current = _label_input(current_input, speaker_name)
    _push(messages, "user", current)
    # The API wants the first message from the user; hot turns always start with one,
    # but a session that begins with an assistant message must not break the request.
    while messages and messages[0]["role"] != "user":
        messages.pop(0)
    return messages


# -- plain functions run in the SQLite thread (Database.read / Database.write) -------------
# They take the sqlite3 connection and never touch the event loop.

def _state(conn: sqlite3.Connection, session_id: str) -> State:
    row = conn.execute(
        "SELECT compressed_upto, extracted_upto, rolling_summary, warm_turns, episode_upto,"
        " failures, next_attempt_at, last_error FROM consolidation_state WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        return State()
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


def _meta(conn: sqlite3.Connection, session_id: str) -> SessionMeta | None:
    row = conn.execute(
        "SELECT id, conv_key, chat_id, thread_id, chat_type, closed_at FROM sessions WHERE id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        return None
    return SessionMeta(row["id"], row["conv_key"], row["chat_id"], row["thread_id"], row["chat_type"], row["closed_at"])


def _warm(conn: sqlite3.Connection, session_id: str, upto_id: int | None = None) -> list[WarmSummary]:
    rows = conn.execute(
        "SELECT id, first_msg_id, last_msg_id, turns, summary, model FROM warm_summaries"
        " WHERE session_id = ? AND folded = 0 AND last_msg_id <= ? ORDER BY id",
        (session_id, _MAX_ID if upto_id is None else upto_id),
    ).fetchall()
    return [WarmSummary(r["id"], r["first_msg_id"], r["last_msg_id"], r["turns"], r["summary"], r["model"])
            for r in rows]


def _last_message(conn: sqlite3.Connection, session_id: str) -> Message | None:
    row = conn.execute(
        "SELECT id, role, content, sender_id, sender_name, lark_message_id FROM messages"
        " WHERE session_id = ? ORDER BY id DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return _message(row) if row else None


def _user_ids_desc(conn: sqlite3.Connection, session_id: str, after_id: int, before_id: int, limit: int) -> list[int]:
    return [r["id"] for r in conn.execute(HOT_IDS_SQL, (session_id, after_id, before_id, limit)).fetchall()]


def _user_ids_asc(conn: sqlite3.Connection, session_id: str, after_id: int, limit: int) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM messages WHERE session_id = ? AND id > ? AND role = 'user'"
        " AND tool_call_id IS NULL ORDER BY id LIMIT ?",
        (session_id, after_id, limit),
    ).fetchall()
    return [r["id"] for r in rows]


def _turns_in(conn: sqlite3.Connection, session_id: str, after_id: int, before_id: int) -> list[Turn]:
    rows = conn.execute(
        "SELECT id, role, content, sender_id, sender_name, lark_message_id, tool_call_id FROM messages"
        " WHERE session_id = ? AND id > ? AND id < ? ORDER BY id",
        (session_id, after_id, before_id),
    ).fetchall()
    turns: list[Turn] = []
    for row in rows:
        msg = _message(row)
        if msg.role == "user" and row["tool_call_id"] is None:
            turns.append(Turn(user=msg))
        elif msg.role == "assistant":
            if not turns:
                turns.append(Turn(user=None))
            turns[-1].assistant.append(msg)
    return turns


def _boundary(conn: sqlite3.Connection, session_id: str, before_message_id: int | None) -> int:
    """Exclusive upper bound of replayable history.

    With ``before_message_id`` (the stored current message) everything before it;
    without, a trailing unanswered user message is taken to be the current input
    (the caller stores it first) and left out, so it never appears twice.
    """
    if before_message_id is not None:
        return before_message_id
    last = _last_message(conn, session_id)
    if last is not None and last.role == "user":
        return last.id
    return _MAX_ID


def _hot_turns(conn: sqlite3.Connection, session_id: str, before_message_id: int | None,
               state: State | None, limit: int) -> list[Turn]:
    state = state or _state(conn, session_id)
    boundary = _boundary(conn, session_id, before_message_id)
    ids = _user_ids_desc(conn, session_id, state.compressed_upto, boundary, limit)
    if not ids:
        return []
    return _turns_in(conn, session_id, min(ids) - 1, boundary)


def _replay(conn: sqlite3.Connection, session_id: str, before_message_id: int | None, state: State,
            cfg: MemoryConfig) -> tuple[list[Turn], int]:
    """Every uncompressed turn before the boundary: the newest ``hot_size + compress_batch - 1``
    always (all there is while consolidation keeps up), a backlog beyond them while the estimated
    tokens fit ``replay_budget``; returns (turns, how many were left out)."""
    boundary = _boundary(conn, session_id, before_message_id)
    ids = _user_ids_desc(conn, session_id, state.compressed_upto, boundary, MAX_REPLAY_TURNS + 1)
    if not ids:
        return [], 0
    beyond = 0
    if len(ids) > MAX_REPLAY_TURNS:
        ids = ids[:MAX_REPLAY_TURNS]
        beyond = _count_user_turns(conn, session_id, state.compressed_upto, min(ids))
    turns = _turns_in(conn, session_id, min(ids) - 1, boundary)
    kept: list[Turn] = []
    tokens = 0
    window = cfg.hot_size + cfg.compress_batch - 1      # what is uncompressed when nothing is late
    for i, turn in enumerate(reversed(turns)):
        cost = _turn_tokens(turn)
        if i >= window and tokens + cost > cfg.replay_budget:
            break
        kept.append(turn)
        tokens += cost
    kept.reverse()
    return kept, len(turns) - len(kept) + beyond


def _count_user_turns(conn: sqlite3.Connection, session_id: str, after_id: int, before_id: int) -> int:
    row = conn.execute(
        "SELECT COUNT(*) AS n FROM (SELECT 1 FROM messages WHERE session_id = ? AND id > ? AND id < ?"
        " AND role = 'user' AND tool_call_id IS NULL LIMIT 10000)",
        (session_id, after_id, before_id),
    ).fetchone()
    return int(row["n"])


def _view(conn: sqlite3.Connection, session_id: str, cfg: MemoryConfig,
          state: State | None = None, warm: list[WarmSummary] | None = None) -> ContextView:
    state = state or _state(conn, session_id)
    warm = _warm(conn, session_id) if warm is None else warm
    hot, trimmed = _replay(conn, session_id, _MAX_ID, state, cfg)
    return ContextView(
        long_term=state.rolling_summary,
        summary="\n\n".join(w.summary for w in warm),
        hot_turns=hot,
        pending=trimmed,
        warm_turns=state.warm_turns,
        warm_rows=len(warm),
    )


def _snapshot(conn: sqlite3.Connection, session_id: str, before_message_id: int | None, cfg: MemoryConfig,
              with_view: bool) -> _Snapshot:
    state = _state(conn, session_id)
    meta = _meta(conn, session_id)
    warm = _warm(conn, session_id)
    hot, trimmed = _replay(conn, session_id, before_message_id, state, cfg)
    view = _view(conn, session_id, cfg, state, warm) if with_view else None
    return _Snapshot(state, bool(meta and meta.is_group), warm, hot, view, trimmed)


def _due(conn: sqlite3.Connection, session_id: str, cfg: MemoryConfig, state: State | None = None) -> Work | None:
    state = state or _state(conn, session_id)
    threshold = cfg.hot_size + cfg.compress_batch
    ids: list[int] = []
    complete = 0
    if state.warm_turns < cfg.warm_capacity:      # only a compression needs the turns counted
        ids = _user_ids_asc(conn, session_id, state.compressed_upto, threshold + 1)
        complete = len(ids)
        if complete <= threshold:
            last = _last_message(conn, session_id)
            if ids and last is not None and last.id == ids[-1]:
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


def _step_inputs(conn: sqlite3.Connection, work: Work) -> StepInputs:
    state = _state(conn, work.session_id)
    if work.kind == "compress":
        after, upto, warm_upto = work.after_id, work.upto_id, None
    else:
        after = state.extracted_upto
        upto, warm_upto = max(work.upto_id, after), work.upto_id
    turns = _turns_in(conn, work.session_id, after, upto + 1) if upto > after else []
    return StepInputs(state, after, upto, turns, _warm(conn, work.session_id, warm_upto))


def _plan(conn: sqlite3.Connection, session_id: str, cfg: MemoryConfig) -> Plan:
    state = _state(conn, session_id)
    meta = _meta(conn, session_id)
    work = _due(conn, session_id, cfg, state) if meta is not None else None
    return Plan(state, meta, _pending_writes(conn, session_id), work)


def _unextracted(conn: sqlite3.Connection, session_id: str) -> tuple[int, int] | None:
    state = _state(conn, session_id)
    last = _last_message(conn, session_id)
    if last is None or last.id <= state.extracted_upto:
        return None
    return state.extracted_upto, last.id


def _pending_writes(conn: sqlite3.Connection, session_id: str) -> list[tuple[int, str, str, dict[str, Any]]]:
    rows = conn.execute(
        "SELECT id, kind, user_id, payload FROM consolidation_writes WHERE session_id = ? ORDER BY id",
        (session_id,),
    ).fetchall()
    return [(r["id"], r["kind"], r["user_id"], json.loads(r["payload"])) for r in rows]


def _ensure_state(conn: sqlite3.Connection, session_id: str, now: float) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO consolidation_state(session_id, updated_at) VALUES (?, ?)", (session_id, now)
    )


def _commit_compression(conn: sqlite3.Connection, work: Work, summary: str, model: str, first_msg_id: int,
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


def _commit_extraction(conn: sqlite3.Connection, session_id: str, after_id: int, upto_id: int,
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


def _done_write(conn: sqlite3.Connection, write_id: int) -> None:
    conn.execute("DELETE FROM consolidation_writes WHERE id = ?", (write_id,))


def _mark_episode(conn: sqlite3.Connection, session_id: str, upto_id: int, now: float) -> None:
    _ensure_state(conn, session_id, now)
    conn.execute(
        "UPDATE consolidation_state SET episode_upto = MAX(episode_upto, ?), failures = 0,"
        " next_attempt_at = 0, last_error = '', updated_at = ? WHERE session_id = ?",
        (upto_id, now, session_id),
    )


def _record_failure(conn: sqlite3.Connection, session_id: str, error: str, base: float, cap_s: float,
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
