"""A recalled (withdrawn) message leaves memory, in one transaction.

``withdraw_message(db, message_id)`` — the transport's id of a user's message that its sender
recalled — removes:

* the message and the bot's answer to it (the assistant messages after it, up to the next
  user message: the answer usually repeats what was recalled) from session history; the
  search index follows through the ``messages_fts`` triggers (and is optimised afterwards,
  so no tombstoned tokens linger);
* the hot zone is those messages, so it follows; warm summaries whose range covers them are
  dropped (their turns are replayed or re-summarised by the next consolidation), and the
  rolling summary is cleared when it was built past them;
* the message from every fact's sources (``fact_messages``: each message a fact was learned
  from); a fact is deleted when that was its last source (a fact also learned elsewhere — say
  in the member's direct chat — stays, private again if only private sources are left);
  profile entries whose provenance is that message, with their pending consolidation writes;
* the episode of the session when it was summarised after the message was written (the
  summary may contain it);
* a still-pending inbox row of the message is marked ignored ("recalled"), so its reply is
  never sent.

It returns what the caller needs to finish the job at the transport: the ids of the bot's
replies (outbox ``lark_message_id``) so they can be recalled too when so configured.
Plain SQL in one BEGIN IMMEDIATE: all or nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from storage import Database
from memory.governance.erase import optimize_index


@dataclass
class Withdrawn:
    message_id: str
    session_id: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    reply_message_ids: list[str] = field(default_factory=list)   # the bot's answers at the transport

    @property
    def found(self) -> bool:
        return bool(self.session_id) or self.counts.get("inbox_cancelled", 0) > 0


async def _run(tx: Any, sql: str, params: tuple = ()) -> int:
    cur = await tx.execute(sql, params)
    n = cur.rowcount
    await cur.close()
    return max(n, 0)


async def _rows(tx: Any, sql: str, params: tuple = ()) -> list[Any]:
    cur = await tx.execute(sql, params)
    rows = await cur.fetchall()
    await cur.close()
    return list(rows)


async def _withdraw_facts(tx: Any, message_id: str) -> int:
    """The recalled message leaves every fact's sources (``fact_messages``); a fact is deleted
    only when no source is left (and the user did not make it theirs in the console: a
    ``user_edit`` fact stays). One still learned elsewhere keeps its first remaining source as
    its provenance, and is private again when every remaining source is. Returns the facts deleted."""
    taught = [r["fact_id"] for r in await _rows(tx, "SELECT fact_id FROM fact_messages WHERE message_id = ?",
                                                 (message_id,))]
    # facts whose provenance names the message but have no source rows (written before v12)
    legacy = [r["id"] for r in await _rows(
        tx, "SELECT id FROM facts WHERE message_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM fact_messages m WHERE m.fact_id = facts.id)", (message_id,))]
    await _run(tx, "DELETE FROM fact_messages WHERE message_id = ?", (message_id,))
    deleted = 0
    for fid in dict.fromkeys([*taught, *legacy]):
        fact = await _rows(tx, "SELECT source, message_id FROM facts WHERE id = ?", (fid,))
        if not fact:
            continue
        left = await _rows(tx, "SELECT chat_id, message_id, visibility FROM fact_messages WHERE fact_id = ?"
                               " ORDER BY learned_at, message_id", (fid,))
        if left:
            first = left[0]
            vis = "shared" if any(r["visibility"] == "shared" for r in left) or fact[0]["source"] == "user_edit" \
                else "private"
            await _run(tx, "UPDATE facts SET chat_id = ?, message_id = ?, visibility = ? WHERE id = ?",
                       (first["chat_id"], first["message_id"], vis, fid))
        elif fact[0]["source"] == "user_edit":
            await _run(tx, "UPDATE facts SET message_id = '' WHERE id = ? AND message_id = ?", (fid, message_id))
        else:
            deleted += await _run(tx, "DELETE FROM facts WHERE id = ?", (fid,))
    return deleted


async def cancel_pending(db: Database, message_id: str, chat_id: str | None = None) -> int:
    """Mark the message's inbox row ignored while it is still pending (its answer is not sent).
    Called at intake, before the recall waits in a mailbox behind the message itself."""
    # the time from here, not the engine's clock function (SQLite's strftime has no PostgreSQL twin)
    return await db.execute(
        "UPDATE inbox SET status = 'ignored', note = 'recalled', done_at = ?"
        " WHERE dedup_key = ? AND status = 'pending'" + (" AND chat_id = ?" if chat_id is not None else ""),
        (time.time(), f"msg:{message_id}") + ((chat_id,) if chat_id is not None else ()))


async def withdraw_message(db: Database, message_id: str, chat_id: str | None = None) -> Withdrawn:
    """Remove a recalled message. ``chat_id``: the chat the recall event names — a message of
    another chat is left alone (``counts["chat_mismatch"]``), as are its facts."""
    out = Withdrawn(message_id)
    c = out.counts
    async with db.transaction() as tx:
        if chat_id is not None:
            where = await _rows(tx, "SELECT s.chat_id FROM messages m JOIN sessions s ON s.id = m.session_id"
                                    " WHERE m.lark_message_id = ? AND m.role = 'user' LIMIT 1", (message_id,))
            inbox = await _rows(tx, "SELECT chat_id FROM inbox WHERE dedup_key = ? LIMIT 1", (f"msg:{message_id}",))
            chats = {r["chat_id"] for r in where + inbox}
            if chats and chat_id not in chats:
                c["chat_mismatch"] = 1
                return out
        c["inbox_cancelled"] = await _run(
            tx, "UPDATE inbox SET status = 'ignored', note = 'recalled'"
                " WHERE dedup_key = ? AND status = 'pending'", (f"msg:{message_id}",))
        users = await _rows(tx, "SELECT id, session_id, created_at FROM messages"
                                " WHERE lark_message_id = ? AND role = 'user'", (message_id,))
        if not users:
            c["facts"] = await _withdraw_facts(tx, message_id)
            c["profile_entries"] = await _run(tx, "DELETE FROM profile_entries WHERE message_id = ?", (message_id,))
            return out
        user = users[0]
        sid, uid_row, written = user["session_id"], user["id"], user["created_at"]
        out.session_id = sid
        nxt = await _rows(tx, "SELECT MIN(id) AS n FROM messages WHERE session_id = ? AND role = 'user'"
                              " AND id > ?", (sid, uid_row))
        upto = nxt[0]["n"] if nxt and nxt[0]["n"] is not None else None
        replies = await _rows(
            tx, "SELECT id FROM messages WHERE session_id = ? AND role = 'assistant' AND id > ?"
                + (" AND id < ?" if upto is not None else ""),
            (sid, uid_row, upto) if upto is not None else (sid, uid_row))
        ids = [uid_row] + [r["id"] for r in replies]
        lo, hi = min(ids), max(ids)
        c["warm_summaries"] = await _run(
            tx, "DELETE FROM warm_summaries WHERE session_id = ? AND first_msg_id <= ? AND last_msg_id >= ?",
            (sid, hi, lo))
        c["rolling_summaries"] = await _run(
            tx, "UPDATE consolidation_state SET rolling_summary = '' WHERE session_id = ?"
                " AND rolling_summary <> '' AND compressed_upto >= ?", (sid, lo))
        marks = ",".join("?" * len(ids))
        c["replies"] = len(ids) - 1
        c["messages"] = await _run(tx, f"DELETE FROM messages WHERE id IN ({marks})", tuple(ids))
        for r in await _rows(tx, "SELECT lark_message_id FROM outbox WHERE reply_to = ?"
                                 " AND lark_message_id IS NOT NULL", (message_id,)):
            out.reply_message_ids.append(r["lark_message_id"])
        c["facts"] = await _withdraw_facts(tx, message_id)
        c["profile_entries"] = await _run(tx, "DELETE FROM profile_entries WHERE message_id = ?", (message_id,))
        c["episodes"] = await _run(
            tx, "DELETE FROM episodes WHERE session_id = ? AND timestamp >= ?", (sid, written))
        await optimize_index(tx, "messages_fts")
        if c["episodes"]:
            await optimize_index(tx, "episodes_fts")
            await optimize_index(tx, "episode_chunks_fts")
    return out
