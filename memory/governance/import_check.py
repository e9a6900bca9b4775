"""Reading an export directory back and validating all of it before anything is written: each
file against its model (memory/governance/export_format.py), then what a model cannot see (refs,
duplicate rules and sessions, the reminders' rules), into a ``Bundle``.

Apart from the import's writes (memory/governance/import_.py) because it is pure: no database,
so a bad directory is refused, with the file, the item and the field named, before a
transaction starts; it computes the episodes' search terms too, so it runs in a thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from memory.episodes.store import prepare_chunks, summary_terms
from memory.governance.export_format import (EPISODES, FACTS, FILES, FORMAT, MANIFEST, MAX_FILE_BYTES, PROCEDURES,
                                             PROFILE, SCHEDULES, VERSION, EpisodeRecord, FactRecord, ImportRefused,
                                             Manifest, ProcedureRecord, ProfileMeta, ScheduleRecord)
from memory.procedures import DEFAULT_MAX_RULES
from memory.profile.store import ProfileError, parse_document
from memory.schedules.recurrence import RecurrenceError, check_rrule, next_after
from memory.text.similarity import normalise


@dataclass
class Bundle:
    """A validated export directory, ready to write."""

    facts: list[FactRecord] = field(default_factory=list)
    procedures: list[ProcedureRecord] = field(default_factory=list)
    profile: dict[str, list[str]] | None = None
    profile_meta: list[ProfileMeta] = field(default_factory=list)
    episodes: list[EpisodeRecord] = field(default_factory=list)
    episode_terms: list[str] = field(default_factory=list)
    episode_chunks: list[list[tuple[str, str]]] = field(default_factory=list)
    schedules: list[ScheduleRecord] = field(default_factory=list)
    manifest: Manifest | None = None
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Reading and validating an export directory
# ---------------------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _read_text(path: Path) -> str:
    name = path.name
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ImportRefused(f"{name}: cannot read ({e.strerror or e})") from None
    if size > MAX_FILE_BYTES:
        raise ImportRefused(f"{name}: too large ({size} bytes; at most {MAX_FILE_BYTES})")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImportRefused(f"{name}: cannot read ({e.strerror or e})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ImportRefused(f"{name}: not UTF-8 text (byte {e.start})") from None


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ImportRefused(f"{path.name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except ValueError as e:
        raise ImportRefused(f"{path.name}: not valid JSON ({e})") from None
    except RecursionError:       # a file nested thousands deep: refused in one line, no traceback
        raise ImportRefused(f"{path.name}: nested too deeply to be an export") from None


def _describe(name: str, what: str, error: ValidationError) -> str:
    err = error.errors(include_url=False)[0]
    loc = list(err.get("loc") or ())
    parts = []
    if loc and isinstance(loc[0], int):
        parts.append(f"{what} {loc.pop(0) + 1}")
    path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
    if path:
        parts.append(path)
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    if err.get("type") == "missing":
        msg = "missing (required)"
    elif err.get("type") == "extra_forbidden":
        msg = "unknown field"
    got = ""
    value = err.get("input")
    if err.get("type") not in ("missing", "extra_forbidden") and "input" in err \
            and not isinstance(value, (dict, list)) \
            and not (isinstance(value, str) and (len(value) > 40 or "refused" in msg)):   # never echo a secret
        got = f" (got {_clip(repr(value))})"
    return f"{name}: " + ": ".join(parts + [msg]) + got


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _records(path: Path, model: type[BaseModel], what: str) -> list[Any]:
    data = _read_json(path)
    if not isinstance(data, list):
        raise ImportRefused(f"{path.name}: expected a JSON array of {what}s, found a JSON {type(data).__name__}")
    try:
        return TypeAdapter(list[model]).validate_python(data)
    except ValidationError as e:
        raise ImportRefused(_describe(path.name, what, e)) from None


def read_bundle(directory: str | Path) -> Bundle:
    """Read and validate an export directory; ImportRefused names the file and field at fault.

    Pure (no database); it also computes the episodes' search terms (jieba), so call it off
    the event loop.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ImportRefused(f"{d}: not a directory")
    b = Bundle()
    for name in FILES:
        (b.present if (d / name).is_file() else b.missing).append(name)
    if not b.present:
        raise ImportRefused(f"{d}: none of {', '.join(FILES)} is there; nothing to import")

    if (d / MANIFEST).is_file():
        data = _read_json(d / MANIFEST)
        if not isinstance(data, dict):
            raise ImportRefused(f"{MANIFEST}: expected a JSON object")
        if data.get("format") != FORMAT:
            raise ImportRefused(f"{MANIFEST}: format: expected {FORMAT!r} (got {_clip(repr(data.get('format')))})")
        version = data.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise ImportRefused(f"{MANIFEST}: version {version} is newer than this Ethan understands ({VERSION})")
        try:
            b.manifest = Manifest.model_validate(data)
        except ValidationError as e:
            raise ImportRefused(_describe(MANIFEST, "item", e)) from None
        if b.manifest.version < 1:
            raise ImportRefused(f"{MANIFEST}: version: expected {VERSION} (got {b.manifest.version})")
        b.profile_meta = list(b.manifest.profile_entries)

    if FACTS in b.present:
        b.facts = _records(d / FACTS, FactRecord, "fact")
        _check_facts(b.facts)
    if PROCEDURES in b.present:
        b.procedures = _records(d / PROCEDURES, ProcedureRecord, "rule")
        seen: dict[str, int] = {}
        for n, p in enumerate(b.procedures, 1):
            key = normalise(p.rule)
            if key in seen:
                raise ImportRefused(f"{PROCEDURES}: rule {n}: the same rule as rule {seen[key]}")
            seen[key] = n
        if len(b.procedures) > DEFAULT_MAX_RULES:
            raise ImportRefused(f"{PROCEDURES}: {len(b.procedures)} rules; a user has at most {DEFAULT_MAX_RULES}")
    if PROFILE in b.present:
        try:
            b.profile = parse_document(_read_text(d / PROFILE))
        except ProfileError as e:
            raise ImportRefused(f"{PROFILE}: {e}") from None
    if EPISODES in b.present:
        b.episodes = _records(d / EPISODES, EpisodeRecord, "episode")
        sessions: dict[str, int] = {}
        for n, e in enumerate(b.episodes, 1):
            if e.session_id in sessions:
                raise ImportRefused(f"{EPISODES}: episode {n}: session_id {e.session_id!r} "
                                    f"is also episode {sessions[e.session_id]}")
            sessions[e.session_id] = n
        b.episode_terms = [summary_terms(e.summary, e.keywords) for e in b.episodes]
        b.episode_chunks = [prepare_chunks(e.turns) for e in b.episodes]
    if (d / SCHEDULES).is_file():
        b.schedules = _records(d / SCHEDULES, ScheduleRecord, "reminder")
        for n, s in enumerate(b.schedules, 1):
            try:
                next_after(s.dtstart, s.tz, check_rrule(s.rrule), 0.0)
            except (RecurrenceError, ValueError) as e:
                raise ImportRefused(f"{SCHEDULES}: reminder {n}: {e}") from None
    return b


def _check_facts(facts: list[FactRecord]) -> None:
    refs: dict[int, int] = {}
    for n, f in enumerate(facts, 1):
        ref = f.ref if f.ref is not None else n
        if ref in refs:
            raise ImportRefused(f"{FACTS}: fact {n}: ref: {ref} is also the ref of fact {refs[ref]}")
        refs[ref] = n
        f.ref = ref
    for n, f in enumerate(facts, 1):
        if f.superseded_by is not None:
            if f.superseded_at is None:
                raise ImportRefused(f"{FACTS}: fact {n}: superseded_by: set, but superseded_at is null")
            if f.superseded_by not in refs:
                raise ImportRefused(f"{FACTS}: fact {n}: superseded_by: no fact has ref {f.superseded_by}")
            if f.superseded_by == f.ref:
                raise ImportRefused(f"{FACTS}: fact {n}: superseded_by: a fact cannot supersede itself")
