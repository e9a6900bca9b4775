"""Erase everything Ethan stores about one user, in one transaction.

``erase_user(db, user_id)`` runs one ``BEGIN IMMEDIATE`` transaction: either all of the
user's data is gone or (on any error) none of it is touched. What it removes:

* **memory**: facts (superseded history included), the user's own procedures
  (``scope='user'``), profile entries, episodes, modes, pending consolidation writes;
* **sessions**: every message they sent, and the assistant messages that answered them
  (the rest of that turn: up to the next user message), so the bot's replies quoting them
  go too; sessions left without any user message are deleted (their warm summaries and
  consolidation state cascade), and conversations left without sessions; in sessions
  that survive (a group where others spoke too) the warm summaries covering their
  messages are deleted and the rolling summary is cleared if it may contain them; the
  session's ``owner_id``/``title`` move to the first remaining speaker when they were
  the owner; their conversation memberships;
* **transport**: inbox rows whose event they sent have the payload replaced by a marker
  (the row, keyed by event_id/message_id, stays: it is the dedup store, so a late
  redelivery of their message is not stored again); their open_id is blanked out of
  other rows' payloads (mentions); outbox rows of replies to their messages are deleted;
* **attribution**: chat rules an admin set keep the rule but lose ``created_by``.

* **other members' episodes** of a group session they spoke in (the session survives):
  the erased person's words must not survive in anyone's memory, while the others keep their
  own. Such an episode's indexed turns (``episode_chunks``) are rebuilt from the lines the
  remaining members said; its summary — written by a model over the whole session, so it may
  quote or paraphrase the erased person in ways no string match can find — is replaced by an
  extractive one made of the remaining lines (``REDACTED_SUMMARY_LINES`` opening sentences),
  its keywords and search terms re-derived, its model recorded as ``REDACTED_MODEL``. An
  episode with no remaining line is deleted. Counted as ``episodes_redacted`` /
  ``episodes_dropped``.

Not touched: the ``audit`` table. The audit row of the erase itself names the erased
open_id — the one place it remains, on purpose, for accountability (who erased whom,
when). Free text that *other* people wrote about them (their own messages, facts, their
lines in an episode) is theirs and stays.

The FTS indexes are optimised afterwards so the deleted text is merged out of their
segments instead of lingering as tombstoned tokens.

``forget_memory(db, user_id)`` is the user's own ``/forget all``: only the memory layers
(facts, own procedures, profile, episodes, pending consolidation writes), one transaction.

``find_user(db, user_id)`` scans every table's text columns for the open_id; it returns
``{table: rows}`` for tables that still mention it (an operator's check after an erase).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import asyncio
import re

from storage import Database, dialect_of, fetch_all, serialize_tx
from memory.episodes.keywords import extract_keywords
from memory.episodes.store import prepare_chunks, summary_terms, write_chunks
from memory.text.tokenizer import is_warm, warm_up
from memory.sessions.records import make_title
from memory.sessions.speaker import label as speaker_label

ERASED_PAYLOAD = '{"erased": true}'
REDACTED_MODEL = "extractive (erase)"   # an episode summary rebuilt without an erased member
REDACTED_SUMMARY_LINES = 6              # opening sentences of the remaining lines kept in it
REDACTED_LINE_CHARS = 80
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;])|(?<=[.] )")

# The sender of an inbox event (Lark v2 envelope).
_SENDER = ("CASE WHEN json_valid(payload) THEN "
           "json_extract(payload, '$.event.sender.sender_id.open_id') END")


@dataclass
class EraseResult:
    user_id: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.counts.items() if v)


async def _run(tx: Any, sql: str, params: tuple = ()) -> int:
    cur = await tx.execute(sql, params)
    try:
        return max(0, cur.rowcount)
    finally:
        await cur.close()


async def _column(tx: Any, sql: str, params: tuple = ()) -> list[Any]:
    cur = await tx.execute(sql, params)
    try:
        return [r[0] for r in await cur.fetchall()]
    finally:
        await cur.close()


async def _optimize(tx: Any, index: str) -> None:
    """Merge SQLite's FTS5 segments so deleted terms leave the index's pages. PostgreSQL's
    indexes are ordinary ones: the deleted rows' entries go with VACUUM (autovacuum)."""
    if dialect_of(tx) == "sqlite":
        await _run(tx, f"INSERT INTO {index}({index}) VALUES ('optimize')")


optimize_index = _optimize   # withdraw.py's index upkeep is the same


def _scrub_payload(payload: str, uid: str) -> str:
    """Another user's event that mentions ``uid``: that mention loses every id and the name
    (it renders as "@someone"); anything else naming the open_id is blanked."""
    try:
        event = json.loads(payload)
        mentions = ((event.get("event") or {}).get("message") or {}).get("mentions") or []
        for m in mentions:
            ids = m.get("id") if isinstance(m, dict) else None
            if isinstance(ids, dict) and ids.get("open_id") == uid:
                for k in ids:
                    ids[k] = ""
                m["name"] = ""
        payload = json.dumps(event, ensure_ascii=False)
    except (ValueError, AttributeError, TypeError):
        pass
    return payload.replace(uid, "")


def redacted_summary(lines: list[str]) -> str:
    """An extractive summary of what the remaining members said: each line's first sentence,
    cut, for the first ``REDACTED_SUMMARY_LINES`` lines."""
    parts = []
    for line in lines[:REDACTED_SUMMARY_LINES]:
        first = _SENTENCE_END.split(" ".join(line.split()), maxsplit=1)[0].strip()
        parts.append(first if len(first) <= REDACTED_LINE_CHARS else first[:REDACTED_LINE_CHARS - 1] + "…")
    return " ".join(p for p in parts if p)


async def _redact_episodes(tx: Any, uid: str, session_ids: list[str]) -> tuple[int, int]:
    """Other members' episodes of ``session_ids`` (her messages already deleted): turns rebuilt
    from the remaining lines, summary replaced by an extractive one (module docs). Returns
    (redacted, dropped)."""
    redacted = dropped = 0
    for sid in session_ids:
        eps = await _column(tx, "SELECT id FROM episodes WHERE session_id = ? AND user_id <> ?", (sid, uid))
        if not eps:
            continue
        upto = await _column(tx, "SELECT episode_upto FROM consolidation_state WHERE session_id = ?", (sid,))
        limit = int(upto[0]) if upto and upto[0] else 0
        rows = await fetch_all(
            tx, "SELECT content, sender_name FROM messages WHERE session_id = ? AND role = 'user'"
                " AND tool_call_id IS NULL AND (? = 0 OR id <= ?) ORDER BY id", (sid, limit, limit))
        # the same lines the episode writer indexes (memory/working/consolidation_queue.py _said)
        lines = [speaker_label(r["content"], r["sender_name"]) if r["sender_name"] else r["content"]
                 for r in rows if (r["content"] or "").strip()]
        em = ",".join("?" * len(eps))
        summary = redacted_summary(lines)
        if not summary:
            dropped += await _run(tx, f"DELETE FROM episodes WHERE id IN ({em})", tuple(eps))
            continue
        keywords = extract_keywords(summary)
        terms = summary_terms(summary, keywords)
        chunks = prepare_chunks(lines)
        await _run(tx, f"UPDATE episodes SET summary = ?, keywords = ?, terms = ?, model = ? WHERE id IN ({em})",
                   (summary, json.dumps(keywords, ensure_ascii=False), terms, REDACTED_MODEL, *eps))
        for eid in eps:
            await write_chunks(tx, eid, chunks)
        redacted += len(eps)
    return redacted, dropped


async def erase_user(db: Database, user_id: str) -> EraseResult:
    """Remove every trace of ``user_id`` (module docs) in one transaction."""
    uid = (user_id or "").strip()
    if not uid:
        raise ValueError("no user to erase")
    c: dict[str, int] = {}
    gone: list[str] = []
    if not is_warm():
        await asyncio.to_thread(warm_up)      # jieba, for rebuilding group episodes: off the loop
    async with db.transaction() as tx:
        await serialize_tx(tx, "user", uid)   # no add of theirs between the reads and the deletes
        # Where they spoke (before their messages go).
        session_ids = await _column(
            tx, "SELECT DISTINCT session_id FROM messages WHERE sender_id = ? "
                "UNION SELECT id FROM sessions WHERE owner_id = ?", (uid, uid))
        marks = ",".join("?" * len(session_ids))
        conv_keys = await _column(
            tx, f"SELECT DISTINCT conv_key FROM sessions WHERE id IN ({marks})", tuple(session_ids)
        ) if session_ids else []

        # Replies to their messages in the outbox (attributable by the triggering message).
        c["outbox"] = await _run(
            tx, "DELETE FROM outbox WHERE reply_to IN ("
                " SELECT lark_message_id FROM messages WHERE sender_id = ? AND lark_message_id IS NOT NULL"
                f" UNION SELECT message_id FROM inbox WHERE message_id IS NOT NULL AND {_SENDER} = ?)",
            (uid, uid))

        # Working memory derived from their turns, in sessions that may survive.
        c["warm_summaries"] = await _run(
            tx, "DELETE FROM warm_summaries WHERE EXISTS (SELECT 1 FROM messages m"
                " WHERE m.session_id = warm_summaries.session_id AND m.sender_id = ?"
                " AND m.id BETWEEN warm_summaries.first_msg_id AND warm_summaries.last_msg_id)", (uid,))
        c["rolling_summaries"] = await _run(
            tx, "UPDATE consolidation_state SET rolling_summary = '' WHERE rolling_summary <> ''"
                " AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = consolidation_state.session_id"
                " AND m.sender_id = ? AND m.id <= consolidation_state.compressed_upto)", (uid,))
        c["consolidation_writes"] = await _run(
            tx, "DELETE FROM consolidation_writes WHERE user_id = ?", (uid,))

        # The bot's answers to them: assistant messages after one of their messages and
        # before the next user message of the session.
        c["replies"] = await _run(
            tx, "DELETE FROM messages WHERE role = 'assistant' AND EXISTS ("
                " SELECT 1 FROM messages u WHERE u.session_id = messages.session_id AND u.role = 'user'"
                " AND u.sender_id = ? AND u.id < messages.id AND NOT EXISTS ("
                "  SELECT 1 FROM messages v WHERE v.session_id = messages.session_id AND v.role = 'user'"
                "  AND v.id > u.id AND v.id < messages.id))", (uid,))
        c["messages"] = await _run(tx, "DELETE FROM messages WHERE sender_id = ?", (uid,))

        if session_ids:
            # Sessions left without any user message go (what was learned only from them goes
            # too, below, once the user's own memory layers are deleted).
            gone = await _column(
                tx, f"SELECT id FROM sessions WHERE id IN ({marks}) AND NOT EXISTS ("
                    " SELECT 1 FROM messages m WHERE m.session_id = sessions.id AND m.role = 'user')",
                tuple(session_ids))
            c["sessions"] = await _run(
                tx, f"DELETE FROM sessions WHERE id IN ({marks}) AND NOT EXISTS ("
                    " SELECT 1 FROM messages m WHERE m.session_id = sessions.id AND m.role = 'user')",
                tuple(session_ids))
            # Sessions they started that others continued: owner and title follow the first
            # remaining speaker (the title is the first user message's opening words).
            rows = await fetch_all(
                tx, "SELECT s.id, (SELECT m.id FROM messages m WHERE m.session_id = s.id AND m.role = 'user'"
                    " ORDER BY m.id LIMIT 1) AS first FROM sessions s WHERE s.owner_id = ?", (uid,))
            for row in rows:
                first = await fetch_all(tx, "SELECT content, sender_id FROM messages WHERE id = ?", (row["first"],))
                content, sender = (first[0]["content"], first[0]["sender_id"]) if first else ("", "")
                await _run(tx, "UPDATE sessions SET owner_id = ?, title = ? WHERE id = ?",
                           (sender, make_title(content), row["id"]))
            c["sessions_reowned"] = len(rows)
        if conv_keys:
            km = ",".join("?" * len(conv_keys))
            c["conversations"] = await _run(
                tx, f"DELETE FROM conversations WHERE conv_key IN ({km}) AND NOT EXISTS ("
                    " SELECT 1 FROM sessions s WHERE s.conv_key = conversations.conv_key)", tuple(conv_keys))
        c["conversation_members"] = await _run(
            tx, "DELETE FROM conversation_members WHERE user_id = ?", (uid,))

        # Memory layers.
        c["facts"] = await _run(tx, "DELETE FROM facts WHERE user_id = ?", (uid,))
        c["procedures"] = await _run(
            tx, "DELETE FROM procedures WHERE scope = 'user' AND scope_id = ?", (uid,))
        c["chat_rules_unattributed"] = await _run(
            tx, "UPDATE procedures SET created_by = '' WHERE created_by = ?", (uid,))
        c["profile_entries"] = await _run(tx, "DELETE FROM profile_entries WHERE user_id = ?", (uid,))
        c["episodes"] = await _run(tx, "DELETE FROM episodes WHERE user_id = ?", (uid,))
        c["episodes_redacted"], c["episodes_dropped"] = await _redact_episodes(
            tx, uid, [s for s in session_ids if s not in set(gone)])
        c["modes"] = await _run(tx, "DELETE FROM modes WHERE user_id = ?", (uid,))
        # Their reminders (every chat), with their delivery history (ON DELETE CASCADE).
        c["schedules"] = await _run(tx, "DELETE FROM schedules WHERE owner_id = ?", (uid,))
        others = await _forget_learned_only(tx, gone)
        c["others_facts"], c["others_profile_entries"] = others["facts"], others["profile_entries"]

        # Transport: their events are scrubbed (the row stays as the dedup record); their
        # open_id is blanked out of everyone else's events (mentions).
        c["inbox"] = await _run(
            tx, f"UPDATE inbox SET payload = ?, note = 'erased',"
                " status = CASE WHEN status = 'pending' THEN 'ignored' ELSE status END"
                f" WHERE {_SENDER} = ?", (ERASED_PAYLOAD, uid))
        c["inbox_mentions"] = 0
        for row in await fetch_all(tx, "SELECT id, payload FROM inbox WHERE instr(payload, ?) > 0", (uid,)):
            await _run(tx, "UPDATE inbox SET payload = ? WHERE id = ?", (_scrub_payload(row["payload"], uid), row["id"]))
            c["inbox_mentions"] += 1

        # Merge the FTS segments so deleted text does not linger as tombstoned tokens.
        if c["messages"] or c["replies"] or c.get("sessions"):
            await _optimize(tx, "messages_fts")
        if c["episodes"] or c["episodes_redacted"] or c["episodes_dropped"]:
            await _optimize(tx, "episodes_fts")
            await _optimize(tx, "episode_chunks_fts")
    return EraseResult(uid, c)


async def find_user(db: Database, user_id: str, *, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Tables whose text columns still contain ``user_id``, with the number of rows."""
    found: dict[str, int] = {}
    for name, cols in (await db.table_columns()).items():
        if name in skip:
            continue
        text_cols = [c for c, kind in cols if kind in ("TEXT", "")]
        if not text_cols:
            continue
        where = " OR ".join(f'instr(CAST("{col}" AS TEXT), ?) > 0' for col in text_cols)
        row = await db.fetchone(f'SELECT COUNT(*) AS n FROM "{name}" WHERE {where}',
                                tuple(user_id for _ in text_cols))
        if row["n"]:
            found[name] = int(row["n"])
    return found


async def forget_memory(db: Database, user_id: str) -> EraseResult:
    """``/forget all``: the user's memory layers — facts (history included), their own
    procedures, profile entries, episodes, and consolidation results not yet applied (which
    would otherwise bring facts back) — in one transaction. Their chat history stays."""
    uid = (user_id or "").strip()
    if not uid:
        raise ValueError("no user to forget")
    c: dict[str, int] = {}
    async with db.transaction() as tx:
        await serialize_tx(tx, "user", uid)
        c["facts"] = await _run(tx, "DELETE FROM facts WHERE user_id = ?", (uid,))
        c["procedures"] = await _run(
            tx, "DELETE FROM procedures WHERE scope = 'user' AND scope_id = ?", (uid,))
        c["profile_entries"] = await _run(tx, "DELETE FROM profile_entries WHERE user_id = ?", (uid,))
        c["episodes"] = await _run(tx, "DELETE FROM episodes WHERE user_id = ?", (uid,))
        c["consolidation_writes"] = await _run(
            tx, "DELETE FROM consolidation_writes WHERE user_id = ?", (uid,))
        # Reminders are memory of what they asked for: forgotten too (delivery history cascades).
        c["schedules"] = await _run(tx, "DELETE FROM schedules WHERE owner_id = ?", (uid,))
        if c["episodes"]:    # /forget rebuilds no group episodes (no episodes_redacted/_dropped here)
            await _optimize(tx, "episodes_fts")
            await _optimize(tx, "episode_chunks_fts")
    return EraseResult(uid, c)


async def _forget_learned_only(tx: Any, session_ids: list[str]) -> dict[str, int]:
    """Facts and profile entries learned only from ``session_ids`` (``fact_sources``,
    ``profile_sources``), deleted; a fact or entry the user wrote themselves (``user_edit``),
    or also taught by a session that stays, is kept. Then those sessions' source rows go."""
    c = {"facts": 0, "profile_entries": 0}
    if not session_ids:
        return c
    sm = ",".join("?" * len(session_ids))
    ids = tuple(session_ids)
    only_here = await _column(
        tx, "SELECT id FROM facts WHERE source <> 'user_edit' AND id IN"
            f" (SELECT fact_id FROM fact_sources WHERE session_id IN ({sm})) AND NOT EXISTS"
            f" (SELECT 1 FROM fact_sources o WHERE o.fact_id = facts.id AND o.session_id NOT IN ({sm}))",
        ids + ids)
    if only_here:
        fm = ",".join("?" * len(only_here))
        # what a deleted fact had superseded is current again (the correction is gone)
        await _run(tx, f"UPDATE facts SET superseded_at = NULL, superseded_by = NULL"
                       f" WHERE superseded_by IN ({fm})", tuple(only_here))
        c["facts"] = await _run(tx, f"DELETE FROM facts WHERE id IN ({fm})", tuple(only_here))
    c["profile_entries"] = await _run(
        tx, "DELETE FROM profile_entries WHERE source <> 'user_edit' AND id IN"
            f" (SELECT entry_id FROM profile_sources WHERE session_id IN ({sm})) AND NOT EXISTS"
            f" (SELECT 1 FROM profile_sources o WHERE o.entry_id = profile_entries.id"
            f"  AND o.session_id NOT IN ({sm}))", ids + ids)
    await _run(tx, f"DELETE FROM fact_sources WHERE session_id IN ({sm})", ids)
    await _run(tx, f"DELETE FROM profile_sources WHERE session_id IN ({sm})", ids)
    return c


async def delete_session(db: Database, session_id: str) -> dict[str, int] | None:
    """Delete a session and what was derived from it alone, in one transaction (DESIGN.md §4):
    its messages, its summaries (warm, rolling — they cascade), every participant's episode of
    it, and the facts and profile entries learned only from it (``fact_sources``,
    ``profile_sources``; one also learned elsewhere, or written by the user, stays). Returns
    the counts, or None when there is no such session."""
    c: dict[str, int] = {}
    async with db.transaction() as tx:
        found = await _column(tx, "SELECT message_count FROM sessions WHERE id = ?", (session_id,))
        if not found:
            return None
        c["messages"] = int(found[0] or 0)
        c["summaries"] = (await _column(
            tx, "SELECT COUNT(*) FROM warm_summaries WHERE session_id = ?", (session_id,)))[0] + (await _column(
            tx, "SELECT COUNT(*) FROM consolidation_state WHERE session_id = ? AND rolling_summary <> ''",
            (session_id,)))[0]
        c["episodes"] = await _run(tx, "DELETE FROM episodes WHERE session_id = ?", (session_id,))
        c.update(await _forget_learned_only(tx, [session_id]))
        # Reminders set in it were derived from it alone.
        c["schedules"] = await _run(tx, "DELETE FROM schedules WHERE session_id = ?", (session_id,))
        c["sessions"] = await _run(tx, "DELETE FROM sessions WHERE id = ?", (session_id,))
    return c
