"""``ethan memory import``: a validated export directory written into the database for one user.

Import (``import_user``) reads a directory, validates everything first — each JSON file
against a pydantic model, each text with the same rules the stores apply (no credentials,
lengths, one line), cross-references (``superseded_by``) — and refuses the whole import with
one ``ImportRefused`` naming the file, the item and the field when anything is wrong. Then it
writes in one transaction, so nothing is ever half-imported. Missing files are skipped (at
least one of the four must be there); ``manifest.json`` is optional (without it, profile
entries are the user's own edits, shared).

Importing is idempotent and never destroys what the database already holds: a fact already
there (same content and creation time, or the same text as an active fact) is left as it
is, a rule with the same normalised text, a profile entry with the same text in the same
section, an episode of the same session are not added again. Import into a fresh database
then export gives the same files (tested). The user named on the command line owns what is
imported; the manifest's ``user_id`` may differ (a Feishu and a Lark app give the same
person different open_ids).

Apart from the reading and validating (memory/governance/import_check.py): this module holds
only the one transaction that writes, file by file, what is not there already.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from storage import Database, fetch_one, serialize_tx
from memory.episodes.store import write_chunks
from memory.governance.export_format import FACTS, PROCEDURES, PROFILE, ImportRefused, ProfileMeta, check_user_id
from memory.governance.import_check import read_bundle
from memory.procedures import DEFAULT_MAX_RULES
from memory.profile.store import MAX_SECTION_ENTRIES, SECTIONS
from memory.scope import PRIVATE_CHAT_TYPES
from memory.schedules.recurrence import check_rrule, next_after
from memory.text.similarity import normalise


@dataclass
class ImportResult:
    directory: Path
    user_id: str
    added: dict[str, int] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    exported_user: str = ""


# ---------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------

async def import_user(db: Database, user_id: str, directory: str | Path, *,
                      clock: Callable[[], float] | None = None) -> ImportResult:
    """Validate ``directory`` completely, then write it for ``user_id`` in one transaction."""
    check_user_id(user_id)
    bundle = await asyncio.to_thread(read_bundle, directory)
    now = (clock or time.time)()
    result = ImportResult(Path(directory), user_id, missing=list(bundle.missing),
                          exported_user=bundle.manifest.user_id if bundle.manifest else "")
    async with db.transaction() as tx:
        await serialize_tx(tx, "user", user_id)
        async def one(sql: str, params: tuple) -> Any:
            return await fetch_one(tx, sql, params)

        async def all_rows(sql: str, params: tuple) -> list[Any]:
            cur = await tx.execute(sql, params)
            try:
                return list(await cur.fetchall())
            finally:
                await cur.close()

        async def insert(sql: str, params: tuple) -> int:
            cur = await tx.execute(sql, params)
            try:
                return int(cur.lastrowid or 0)
            finally:
                await cur.close()

        # -- facts ---------------------------------------------------------------------
        added = unchanged = 0
        if FACTS in bundle.present:
            active_norms = {r["norm"] for r in await all_rows(
                "SELECT norm FROM facts WHERE user_id = ? AND superseded_at IS NULL", (user_id,))}
            ids: dict[int, int] = {}
            links: list[tuple[int, int]] = []
            for f in bundle.facts:
                norm = normalise(f.content)
                row = await one("SELECT id FROM facts WHERE user_id = ? AND content = ? AND created_at = ?",
                                (user_id, f.content, f.created_at))
                if row is None and f.superseded_at is None and norm in active_norms:
                    row = await one("SELECT id FROM facts WHERE user_id = ? AND norm = ? AND superseded_at IS NULL"
                                    " ORDER BY id LIMIT 1", (user_id, norm))
                if row is not None:
                    ids[f.ref] = row["id"]
                    unchanged += 1
                    continue
                new_id = await insert(
                    "INSERT INTO facts(user_id, content, norm, category, confidence, source, visibility, chat_id,"
                    " message_id, created_at, updated_at, last_accessed, hit_count, superseded_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (user_id, f.content, norm, f.category, f.confidence, f.source, f.visibility, f.chat_id,
                     f.message_id, f.created_at, f.updated_at if f.updated_at is not None else f.created_at,
                     f.last_accessed, f.hit_count, f.superseded_at))
                ids[f.ref] = new_id
                if f.superseded_by is not None:
                    links.append((new_id, f.superseded_by))
                added += 1
            for fact_id, ref in links:
                await tx.execute("UPDATE facts SET superseded_by = ? WHERE user_id = ? AND id = ?",
                                 (ids[ref], user_id, fact_id))
        result.added["facts"], result.unchanged["facts"] = added, unchanged

        # -- procedures ----------------------------------------------------------------
        added = unchanged = 0
        if PROCEDURES in bundle.present:
            existing = {r["norm"] for r in await all_rows(
                "SELECT norm FROM procedures WHERE scope = 'user' AND scope_id = ?", (user_id,))}
            new = [p for p in bundle.procedures if normalise(p.rule) not in existing]
            if len(existing) + len(new) > DEFAULT_MAX_RULES:
                raise ImportRefused(
                    f"{PROCEDURES}: {user_id} would have {len(existing) + len(new)} rules "
                    f"(at most {DEFAULT_MAX_RULES}); nothing was imported")
            for p in bundle.procedures:
                norm = normalise(p.rule)
                if norm in existing:
                    unchanged += 1
                    continue
                await tx.execute(
                    "INSERT INTO procedures(scope, scope_id, rule, context, norm, visibility, created_by, chat_id,"
                    " message_id, created_at) VALUES ('user', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (user_id, p.rule, p.context, norm, p.visibility, user_id, p.chat_id, p.message_id, p.created_at))
                existing.add(norm)
                added += 1
        result.added["procedures"], result.unchanged["procedures"] = added, unchanged

        # -- profile -------------------------------------------------------------------
        added = unchanged = 0
        if bundle.profile is not None:
            meta: dict[tuple[str, str], list[ProfileMeta]] = {}
            for m in bundle.profile_meta:
                meta.setdefault((m.section, m.entry), []).append(m)
            rows = await all_rows(
                "SELECT section, entry, position FROM profile_entries WHERE user_id = ?", (user_id,))
            have: dict[tuple[str, str], int] = {}
            count: dict[str, int] = {}
            next_pos: dict[str, int] = {}
            for r in rows:
                have[(r["section"], r["entry"])] = have.get((r["section"], r["entry"]), 0) + 1
                count[r["section"]] = count.get(r["section"], 0) + 1
                next_pos[r["section"]] = max(next_pos.get(r["section"], 0), r["position"] + 1)
            for section in SECTIONS:
                for entry in bundle.profile.get(section, []):
                    key = (section, entry)
                    info = meta.get(key, [])
                    m = info.pop(0) if info else None
                    if have.get(key, 0) > 0:
                        have[key] -= 1
                        unchanged += 1
                        continue
                    if count.get(section, 0) >= MAX_SECTION_ENTRIES:
                        raise ImportRefused(
                            f"{PROFILE}: section {section} would have more than {MAX_SECTION_ENTRIES} entries; "
                            "nothing was imported")
                    position = next_pos.get(section, 0)
                    await tx.execute(
                        "INSERT INTO profile_entries(user_id, section, position, entry, visibility, source, chat_id,"
                        " message_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (user_id, section, position, entry,
                         m.visibility if m else "shared", m.source if m else "user_edit",
                         m.chat_id if m else "", m.message_id if m else "",
                         m.created_at if m else now, m.updated_at if m else now))
                    next_pos[section] = position + 1
                    count[section] = count.get(section, 0) + 1
                    added += 1
        result.added["profile_entries"], result.unchanged["profile_entries"] = added, unchanged

        # -- episodes ------------------------------------------------------------------
        added = unchanged = 0
        for e, terms, chunks in zip(bundle.episodes, bundle.episode_terms,
                                    bundle.episode_chunks or [[] for _ in bundle.episodes]):
            # unknown origin (no visibility, no chat type): private, the safe side
            visibility = e.visibility or ("shared" if e.chat_type and e.chat_type not in PRIVATE_CHAT_TYPES
                                          else "private")
            cur = await tx.execute(
                "INSERT INTO episodes(user_id, session_id, chat_id, chat_type, visibility, summary, keywords, terms,"
                " model, turn_count, timestamp, started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(user_id, session_id) DO NOTHING RETURNING id",
                (user_id, e.session_id, e.chat_id, e.chat_type, visibility, e.summary,
                 json.dumps(e.keywords, ensure_ascii=False), terms, e.model, e.turn_count, e.timestamp,
                 e.started_at, e.ended_at))
            new = await cur.fetchone()
            if new is not None:
                if chunks:
                    await write_chunks(tx, new["id"], chunks)
                added += 1
            else:
                unchanged += 1
            await cur.close()
        result.added["episodes"], result.unchanged["episodes"] = added, unchanged

        # -- reminders -----------------------------------------------------------------
        added = unchanged = 0
        for s in bundle.schedules:
            rule = check_rrule(s.rrule)
            if await one("SELECT id FROM schedules WHERE owner_id = ? AND state = 'active' AND chat_id = ?"
                         " AND text = ? AND dtstart = ? AND rrule = ?", (user_id, s.chat_id, s.text, s.dtstart, rule)):
                unchanged += 1
                continue
            due = next_after(s.dtstart, s.tz, rule, now, inclusive=True)
            if due is None:           # nothing left to send
                unchanged += 1
                continue
            await tx.execute(
                "INSERT INTO schedules(owner_id, chat_id, chat_type, text, use_model, tz, dtstart, rrule, next_due,"
                " state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)",
                (user_id, s.chat_id, s.chat_type, s.text, int(s.use_model), s.tz, s.dtstart, rule, due,
                 s.created_at if s.created_at is not None else now, now))
            added += 1
        if bundle.schedules:
            result.added["schedules"], result.unchanged["schedules"] = added, unchanged
    return result
