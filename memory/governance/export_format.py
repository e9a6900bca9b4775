"""``ethan memory export`` / ``import``: one user's memory as the spec's files, and back.

Layout of an export directory (UTF-8, JSON pretty-printed with two spaces):

``facts.json``
    a JSON array, oldest first: the spec's fields ``content``, ``category``, ``confidence``,
    ``source``, ``created_at``, ``last_accessed``, ``hit_count``, plus ``ref`` (the fact's
    number in this file, 1-based) and our provenance: ``visibility`` (private = learned in a
    p2p chat), ``chat_id``, ``message_id``, ``updated_at``, ``superseded_at`` and
    ``superseded_by`` (the ``ref`` of the fact that replaced it; superseded facts are history,
    kept, never injected).
``procedures.json``
    a JSON array of the user's own behaviour rules, oldest first: ``rule``, ``context``,
    ``created_at``, ``visibility``, ``chat_id``, ``message_id``. (A chat's rules belong to the
    chat, not to whoever set them, and are not exported.)
``user_profile.md``
    the profile document as the spec shows it: ``# 用户画像`` then ``## <section>`` headings
    with ``- `` bullets (sections without entries are left out; empty profile: empty file).
``episodes.json``
    a JSON array, oldest first: the spec's record ``session_id``, ``summary``, ``timestamp``,
    ``model``, ``turn_count``, ``keywords``, plus ``chat_id``, ``chat_type``, ``visibility``,
    ``started_at`` / ``ended_at`` (the session's dates) and ``turns`` (the lines the users said,
    which the episode index searches beside the summary; an import re-indexes them). A summary
    longer than the store keeps is cut, not refused; a bad record is named by its number.
``schedules.json``
    the user's active reminders (ours, beside the spec's four): ``text``, ``chat_id``,
    ``chat_type``, ``tz``, ``dtstart`` (local), ``rrule``, ``use_model``, ``created_at``. An
    import adds those that still have an occurrence to come (the next one computed again) and
    are not there already (same chat, text, start and rule).
``manifest.json``
    what the export is (``format``, ``version``, ``user_id``, ``counts``) and what Markdown
    cannot carry: each profile entry's ``visibility`` and provenance (``profile_entries``).

Times are Unix seconds (floats), as the spec's episode record has them. An export is a
pure function of the database: exporting twice gives identical files.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, TypeAdapter, ValidationError, field_validator

from storage import Database, fetch_one, serialize_tx
from memory.episodes.store import (MAX_BODY_LINES, MAX_IMPORT_SUMMARY_CHARS, MAX_KEYWORDS, MAX_SUMMARY_CHARS,
                             CHUNK_LINES, CHUNK_STRIDE,
                             prepare_chunks, summary_terms, write_chunks)
from memory.facts.store import CATEGORIES, SOURCES as FACT_SOURCES, FactError, clean_content
from memory.procedures import DEFAULT_MAX_RULES, clean_context, clean_rule
from memory.profile.store import (
    MAX_SECTION_ENTRIES,
    SECTIONS,
    SOURCES as PROFILE_SOURCES,
    ProfileError,
    clean_entry,
    parse_document,
    render,
    resolve_section,
)
from memory.scope import PRIVATE_CHAT_TYPES
from memory.schedules.recurrence import RecurrenceError, check_rrule, next_after
from memory.text.similarity import normalise

FORMAT = "ethan-memory"
VERSION = 1
FACTS, PROCEDURES, PROFILE, EPISODES, MANIFEST = (
    "facts.json", "procedures.json", "user_profile.md", "episodes.json", "manifest.json",
)
FILES = (FACTS, PROCEDURES, PROFILE, EPISODES)
SCHEDULES = "schedules.json"      # optional: exports before reminders have none
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_KEYWORD_CHARS = 40
MAX_ID_CHARS = 200


class ImportRefused(ValueError):
    """The directory cannot be imported; the message names the file and what is wrong."""


# ---------------------------------------------------------------------------------------
# File models
# ---------------------------------------------------------------------------------------

Timestamp = Annotated[float, Field(allow_inf_nan=False, ge=0)]
Visibility = Literal["private", "shared"]
Id = Annotated[StrictStr, Field(max_length=MAX_ID_CHARS)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class FactRecord(_Record):
    ref: StrictInt | None = Field(default=None, ge=1)
    content: StrictStr
    category: Literal[CATEGORIES]  # type: ignore[valid-type]
    confidence: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    source: Literal[FACT_SOURCES]  # type: ignore[valid-type]
    created_at: Timestamp
    last_accessed: Timestamp
    hit_count: Annotated[StrictInt, Field(ge=0)] = 0
    visibility: Visibility = "private"
    chat_id: Id = ""
    message_id: Id = ""
    updated_at: Timestamp | None = None
    superseded_at: Timestamp | None = None
    superseded_by: StrictInt | None = Field(default=None, ge=1)

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        try:
            return clean_content(v)
        except FactError as e:
            raise ValueError(str(e)) from None


class ProcedureRecord(_Record):
    rule: StrictStr
    context: StrictStr = ""
    created_at: Timestamp
    visibility: Visibility = "shared"
    chat_id: Id = ""
    message_id: Id = ""

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str) -> str:
        return clean_rule(v)

    @field_validator("context")
    @classmethod
    def _context(cls, v: str) -> str:
        return clean_context(v)


class EpisodeRecord(_Record):
    session_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)]
    summary: StrictStr
    timestamp: Timestamp
    model: Id = ""
    turn_count: Annotated[StrictInt, Field(ge=0)]
    keywords: list[StrictStr] = Field(default_factory=list, max_length=MAX_KEYWORDS)
    chat_id: Id = ""
    chat_type: Id = ""
    visibility: Visibility | None = None
    started_at: Timestamp | None = None
    ended_at: Timestamp | None = None
    turns: list[StrictStr] = Field(default_factory=list, max_length=MAX_BODY_LINES * 10)

    @field_validator("summary")
    @classmethod
    def _summary(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("the summary is empty")
        if len(v) > MAX_IMPORT_SUMMARY_CHARS:
            raise ValueError(f"the summary is too long ({len(v)} characters, at most {MAX_IMPORT_SUMMARY_CHARS})")
        if len(v) > MAX_SUMMARY_CHARS:      # long text is kept as the store keeps it: cut
            v = v[: MAX_SUMMARY_CHARS - 1].rstrip() + "…"
        return v

    @field_validator("keywords")
    @classmethod
    def _keywords(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for kw in v:
            if kw != " ".join(kw.split()) or not kw:
                raise ValueError(f"keyword {kw[:40]!r} is empty or has extra whitespace")
            if len(kw) > MAX_KEYWORD_CHARS:
                raise ValueError(f"keyword {kw[:40]!r}… is longer than {MAX_KEYWORD_CHARS} characters")
            if kw in seen:
                raise ValueError(f"keyword {kw!r} appears twice")
            seen.add(kw)
        return v


class ProfileMeta(_Record):
    section: StrictStr
    entry: StrictStr
    visibility: Visibility = "shared"
    source: Literal[PROFILE_SOURCES] = "user_edit"  # type: ignore[valid-type]
    chat_id: Id = ""
    message_id: Id = ""
    created_at: Timestamp
    updated_at: Timestamp

    @field_validator("section")
    @classmethod
    def _section(cls, v: str) -> str:
        try:
            return resolve_section(v)
        except ProfileError as e:
            raise ValueError(str(e)) from None

    @field_validator("entry")
    @classmethod
    def _entry(cls, v: str) -> str:
        try:
            return clean_entry(v, strip_bullet=False)
        except ProfileError as e:
            raise ValueError(str(e)) from None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: Literal["ethan-memory"]
    version: StrictInt
    user_id: StrictStr = ""
    counts: dict[str, int] = Field(default_factory=dict)
    profile_entries: list[ProfileMeta] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------

@dataclass
class ExportResult:
    directory: Path
    user_id: str
    counts: dict[str, int]
    files: list[Path]


@dataclass
class ImportResult:
    directory: Path
    user_id: str
    added: dict[str, int] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    exported_user: str = ""


class ScheduleRecord(_Record):
    text: Annotated[StrictStr, Field(min_length=1, max_length=1000)]
    chat_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)]
    chat_type: Literal["p2p", "group"]
    tz: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    dtstart: Annotated[StrictStr, Field(min_length=10, max_length=40)]
    rrule: Annotated[StrictStr, Field(max_length=300)] = ""
    use_model: bool = False
    created_at: Timestamp | None = None


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


def check_user_id(user_id: Any) -> str:
    if not isinstance(user_id, str) or not user_id.strip() or len(user_id) > MAX_ID_CHARS \
            or any(ch.isspace() for ch in user_id):
        raise ValueError("a user id (open_id such as ou_…) is required, without spaces")
    return user_id


# ---------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------

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
