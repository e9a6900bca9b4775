"""``ethan memory export``: one user's memory written as the files of memory/governance/export_format.py.

Read in one transaction (the user's memory writes wait), so the files are one consistent set;
each file is written atomically. An export is a pure function of the database: exporting twice
gives identical files. Apart from import, which reads the files back (memory/governance/import_.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage import Database, serialize_tx
from memory.episodes.chunks import CHUNK_LINES, CHUNK_STRIDE
from memory.governance.export_format import (EPISODES, FACTS, FORMAT, MANIFEST, PROCEDURES, PROFILE, SCHEDULES,
                                             VERSION, check_user_id)
from memory.profile.store import SECTIONS, render


@dataclass
class ExportResult:
    directory: Path
    user_id: str
    counts: dict[str, int]
    files: list[Path]


async def collect(db: Database, user_id: str) -> dict[str, str]:
    """The export's files (name → text) for ``user_id``, read in one transaction."""
    check_user_id(user_id)
    async with db.transaction() as tx:
        await serialize_tx(tx, "user", user_id)   # the user's memory writes wait: one consistent set
        async def rows(sql: str, params: tuple) -> list[Any]:
            cur = await tx.execute(sql, params)
            try:
                return list(await cur.fetchall())
            finally:
                await cur.close()

        fact_rows = await rows(
            "SELECT id, content, category, confidence, source, visibility, chat_id, message_id, created_at,"
            " updated_at, last_accessed, hit_count, superseded_at, superseded_by"
            " FROM facts WHERE user_id = ? ORDER BY created_at, id", (user_id,))
        proc_rows = await rows(
            "SELECT rule, context, visibility, chat_id, message_id, created_at FROM procedures"
            " WHERE scope = 'user' AND scope_id = ? ORDER BY created_at, id", (user_id,))
        profile_rows = await rows(
            "SELECT section, entry, visibility, source, chat_id, message_id, created_at, updated_at"
            " FROM profile_entries WHERE user_id = ? ORDER BY position, id", (user_id,))
        episode_rows = await rows(
            "SELECT id, session_id, summary, timestamp, model, turn_count, keywords, chat_id, chat_type, visibility,"
            " started_at, ended_at FROM episodes WHERE user_id = ? ORDER BY timestamp, id", (user_id,))
        chunk_rows = await rows(
            "SELECT c.episode_id, c.text FROM episode_chunks c JOIN episodes e ON e.id = c.episode_id"
            " WHERE e.user_id = ? ORDER BY c.episode_id, c.seq", (user_id,))
        schedule_rows = await rows(
            "SELECT text, chat_id, chat_type, tz, dtstart, rrule, use_model, created_at FROM schedules"
            " WHERE owner_id = ? AND state = 'active' ORDER BY created_at, id", (user_id,))

    refs = {r["id"]: n for n, r in enumerate(fact_rows, 1)}
    facts = [
        {
            "ref": refs[r["id"]],
            "content": r["content"],
            "category": r["category"],
            "confidence": r["confidence"],
            "source": r["source"],
            "created_at": r["created_at"],
            "last_accessed": r["last_accessed"],
            "hit_count": r["hit_count"],
            "visibility": r["visibility"],
            "chat_id": r["chat_id"],
            "message_id": r["message_id"],
            "updated_at": r["updated_at"],
            "superseded_at": r["superseded_at"],
            # the replacing fact may have been deleted since: then there is nothing to point at
            "superseded_by": refs.get(r["superseded_by"]) if r["superseded_by"] is not None else None,
        }
        for r in fact_rows
    ]
    procedures = [
        {"rule": r["rule"], "context": r["context"], "created_at": r["created_at"],
         "visibility": r["visibility"], "chat_id": r["chat_id"], "message_id": r["message_id"]}
        for r in proc_rows
    ]
    order = {s: i for i, s in enumerate(SECTIONS)}
    profile_sorted = sorted(enumerate(profile_rows), key=lambda p: (order.get(p[1]["section"], 99), p[0]))
    grouped: dict[str, list[str]] = {}
    profile_meta = []
    for _, r in profile_sorted:
        grouped.setdefault(r["section"], []).append(r["entry"])
        profile_meta.append({
            "section": r["section"], "entry": r["entry"], "visibility": r["visibility"], "source": r["source"],
            "chat_id": r["chat_id"], "message_id": r["message_id"], "created_at": r["created_at"],
            "updated_at": r["updated_at"],
        })
    turns_of: dict[int, list[str]] = {}
    for r in chunk_rows:      # chunks overlap by one line (episodic.CHUNK_LINES - CHUNK_STRIDE)
        part = r["text"].split("\n")
        have = turns_of.setdefault(r["episode_id"], [])
        have.extend(part if not have else part[CHUNK_LINES - CHUNK_STRIDE:])
    episodes = []
    for r in episode_rows:
        try:
            keywords = json.loads(r["keywords"] or "[]")
        except ValueError:
            keywords = []
        episodes.append({
            "session_id": r["session_id"], "summary": r["summary"], "timestamp": r["timestamp"],
            "model": r["model"], "turn_count": r["turn_count"],
            "keywords": [str(k) for k in keywords] if isinstance(keywords, list) else [],
            "chat_id": r["chat_id"], "chat_type": r["chat_type"], "visibility": r["visibility"],
            "started_at": r["started_at"], "ended_at": r["ended_at"],
            "turns": turns_of.get(r["id"], []),
        })
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "user_id": user_id,
        "counts": {"facts": len(facts), "procedures": len(procedures), "profile_entries": len(profile_meta),
                   "episodes": len(episodes)},
        "profile_entries": profile_meta,
    }
    schedules = [
        {"text": r["text"], "chat_id": r["chat_id"], "chat_type": r["chat_type"], "tz": r["tz"],
         "dtstart": r["dtstart"], "rrule": r["rrule"], "use_model": bool(r["use_model"]),
         "created_at": r["created_at"]}
        for r in schedule_rows
    ]
    return {
        FACTS: _json(facts),
        PROCEDURES: _json(procedures),
        PROFILE: render(grouped, title=True),
        EPISODES: _json(episodes),
        SCHEDULES: _json(schedules),
        MANIFEST: _json(manifest),
    }


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False) + "\n"


async def export_user(db: Database, user_id: str, out_dir: str | Path) -> ExportResult:
    """Write ``user_id``'s memory to ``out_dir`` (created if needed; our files replaced)."""
    files = await collect(db, user_id)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        written.append(_write_atomic(directory / name, text))
    counts = json.loads(files[MANIFEST])["counts"]
    return ExportResult(directory, user_id, counts, written)


def _write_atomic(path: Path, text: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
