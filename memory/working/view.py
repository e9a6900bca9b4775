"""Layer 2: the working-memory view — the window over one session's stored messages that
the next request replays, and the context assembled from it.

A *turn* is one user message and the assistant message(s) stored after it, up to
the next user message (memory/working/turns.py: the rows, the readers, ``MemoryConfig``).
What the view shows follows consolidation's record (``consolidation_state``):

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

Consolidation itself is elsewhere: the state machine (the record, what is due, the job's
phases and transitions) is memory/working/consolidation_state.py, where its progress is read and
advanced (every statement over the record, the pending writes, the warm-row commits) is
memory/working/consolidation_store.py, and the job is memory/working/consolidation_queue.py. This module only
reads the record (``read_state``).

Reads here are bounded, indexed queries (``messages_session(session_id, id)`` scanned
backwards with a LIMIT): the whole session is never loaded. Nothing here writes or calls a model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from memory.working.consolidation_state import State
from memory.working.consolidation_store import read_state, read_state_and_meta
from memory.sessions.speaker import label as speaker_label
from memory.text.tokens import estimate_tokens
from memory.working.turns import (MAX_ID, MemoryConfig, Message, SessionMeta, Turn, WarmSummary, group_turns,
                          is_turn_start, read_last_message, read_message_rows, read_meta, read_turns, read_warm)
from storage import Connection, Database

REPLAY_CAP = 4000                   # chars per replayed stored message
TRUNCATED = "…(truncated)"
# Shown to the model where turns had to be left out (consolidation behind, budget reached).
TRIMMED = "[…更早的 {n} 轮对话未能回放 / {n} earlier turns not shown…]"
MAX_REPLAY_TURNS = 200              # bound of the replay query, whatever the budget
LONG_TERM_TAG = "[长期记忆]"
SUMMARY_TAG = "[对话摘要]"
ACK = "好的。"

log = logging.getLogger("ethan.working")

# The hot window's user messages: messages_session(session_id, id) walked backwards, LIMITed.
HOT_IDS_SQL = (
    "SELECT id FROM messages WHERE session_id = ? AND id > ? AND id < ? AND role = 'user'"
    " AND tool_call_id IS NULL ORDER BY id DESC LIMIT ?"
)


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
    return speaker_label(text, name)     # escaped: a member cannot fake another's label (memory/sessions/speaker.py)


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

    # -- the session's rows -------------------------------------------------------
    async def session(self, session_id: str) -> SessionMeta | None:
        return await self.db.read(read_meta, session_id)

    async def warm(self, session_id: str, *, upto_id: int | None = None) -> list[WarmSummary]:
        """Unfolded warm rows in order (optionally only those ending at or before upto_id)."""
        return await self.db.read(read_warm, session_id, upto_id)

    async def last_message(self, session_id: str) -> Message | None:
        return await self.db.read(read_last_message, session_id)

    # -- reading turns (bounded) ---------------------------------------------------
    async def turns(self, session_id: str, after_id: int, upto_id: int) -> list[Turn]:
        """Turns made of the messages in (after_id, upto_id]."""
        return await self.db.read(read_turns, session_id, after_id, upto_id + 1)

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
            # The fields as ``extra``: bot/infra/log.py writes them as the JSON line's own keys.
            log.warning("working.replay_trimmed", extra={
                "session_id": session_id, "trimmed": snap.trimmed, "replayed": len(snap.hot),
                "failures": snap.state.failures, "last_error": snap.state.last_error[:120]})
        return _assemble(snap, current_input, speaker_name)

    async def view(self, session_id: str) -> ContextView:
        return await self.db.read(_view, session_id, self.config)


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


# -- plain functions run in a unit of work (Database.read) ----------------------------------
# They take the unit's connection and never touch the event loop.

def _user_ids_desc(conn: Connection, session_id: str, after_id: int, before_id: int, limit: int) -> list[int]:
    return [r["id"] for r in conn.execute(HOT_IDS_SQL, (session_id, after_id, before_id, limit)).fetchall()]


def _boundary(conn: Connection, session_id: str, before_message_id: int | None) -> int:
    """Exclusive upper bound of replayable history.

    With ``before_message_id`` (the stored current message) everything before it;
    without, a trailing unanswered user message is taken to be the current input
    (the caller stores it first) and left out, so it never appears twice.
    """
    if before_message_id is not None:
        return before_message_id
    last = read_last_message(conn, session_id)
    if last is not None and last.role == "user":
        return last.id
    return MAX_ID


def _hot_turns(conn: Connection, session_id: str, before_message_id: int | None,
               state: State | None, limit: int) -> list[Turn]:
    state = state or read_state(conn, session_id)
    boundary = _boundary(conn, session_id, before_message_id)
    ids = _user_ids_desc(conn, session_id, state.compressed_upto, boundary, limit)
    if not ids:
        return []
    return read_turns(conn, session_id, min(ids) - 1, boundary)


def _replay(conn: Connection, session_id: str, before_message_id: int | None, state: State,
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
    return _trim(read_turns(conn, session_id, min(ids) - 1, boundary), beyond, cfg)


def _trim(turns: list[Turn], beyond: int, cfg: MemoryConfig) -> tuple[list[Turn], int]:
    """The replay budget applied to ``turns`` (oldest first); ``beyond``: turns older still,
    left out by the query's bound."""
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


def _replay_and_view(conn: Connection, session_id: str, before_message_id: int, state: State,
                     cfg: MemoryConfig) -> tuple[tuple[list[Turn], int], tuple[list[Turn], int]]:
    """``_replay`` before ``before_message_id`` and ``_replay`` of everything (the view: the
    current message and what follows it too) from one read of the messages, where both
    windows start at the same turn — all but a session with more than ``MAX_REPLAY_TURNS``
    uncompressed turns, which reads the view's window on its own."""
    ids = _user_ids_desc(conn, session_id, state.compressed_upto, before_message_id, MAX_REPLAY_TURNS + 1)
    if len(ids) <= MAX_REPLAY_TURNS:
        start = min(ids) if ids else before_message_id
        rows = read_message_rows(conn, session_id, start - 1, MAX_ID)
        tail = [r["id"] for r in rows
                if r["id"] >= before_message_id and r["id"] > state.compressed_upto and is_turn_start(r)]
        if len(ids) + len(tail) <= MAX_REPLAY_TURNS:
            replay = _trim(group_turns([r for r in rows if r["id"] < before_message_id]), 0, cfg) if ids else ([], 0)
            if not ids and not tail:
                return replay, ([], 0)
            first = min(ids) if ids else min(tail)
            return replay, _trim(group_turns([r for r in rows if r["id"] >= first]), 0, cfg)
        # more turns than one query's bound: the view's window starts later than the replay's
    return (_replay(conn, session_id, before_message_id, state, cfg),
            _replay(conn, session_id, MAX_ID, state, cfg))


def _count_user_turns(conn: Connection, session_id: str, after_id: int, before_id: int) -> int:
    row = conn.execute(
        "SELECT COUNT(*) AS n FROM (SELECT 1 FROM messages WHERE session_id = ? AND id > ? AND id < ?"
        " AND role = 'user' AND tool_call_id IS NULL LIMIT 10000) AS t",   # PostgreSQL < 16 wants the alias
        (session_id, after_id, before_id),
    ).fetchone()
    return int(row["n"])


def _view(conn: Connection, session_id: str, cfg: MemoryConfig,
          state: State | None = None, warm: list[WarmSummary] | None = None,
          replayed: tuple[list[Turn], int] | None = None) -> ContextView:
    state = state or read_state(conn, session_id)
    warm = read_warm(conn, session_id) if warm is None else warm
    hot, trimmed = replayed or _replay(conn, session_id, MAX_ID, state, cfg)
    return ContextView(
        long_term=state.rolling_summary,
        summary="\n\n".join(w.summary for w in warm),
        hot_turns=hot,
        pending=trimmed,
        warm_turns=state.warm_turns,
        warm_rows=len(warm),
    )


def _snapshot(conn: Connection, session_id: str, before_message_id: int | None, cfg: MemoryConfig,
              with_view: bool) -> _Snapshot:
    state, meta = read_state_and_meta(conn, session_id)
    warm = read_warm(conn, session_id)
    view = None
    if with_view and before_message_id is not None:
        (hot, trimmed), replayed = _replay_and_view(conn, session_id, before_message_id, state, cfg)
        view = _view(conn, session_id, cfg, state, warm, replayed)
    else:
        hot, trimmed = _replay(conn, session_id, before_message_id, state, cfg)
        if with_view:
            view = _view(conn, session_id, cfg, state, warm)
    return _Snapshot(state, bool(meta and meta.is_group), warm, hot, view, trimmed)
