"""The files of an ``ethan memory export`` directory: their names, the format's version, and the
pydantic model each record is validated against on import.

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

Apart from export and import because both speak this format: memory/governance/export.py writes
it, memory/governance/import_check.py reads and validates it, memory/governance/import_.py
writes what it holds into the database.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from memory.episodes.keywords import MAX_KEYWORDS
from memory.episodes.store import MAX_BODY_LINES, MAX_IMPORT_SUMMARY_CHARS, MAX_SUMMARY_CHARS
from memory.facts.store import CATEGORIES, SOURCES as FACT_SOURCES, FactError, clean_content
from memory.procedures import clean_context, clean_rule
from memory.profile.store import SOURCES as PROFILE_SOURCES, ProfileError, clean_entry, resolve_section

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


class ScheduleRecord(_Record):
    text: Annotated[StrictStr, Field(min_length=1, max_length=1000)]
    chat_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)]
    chat_type: Literal["p2p", "group"]
    tz: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    dtstart: Annotated[StrictStr, Field(min_length=10, max_length=40)]
    rrule: Annotated[StrictStr, Field(max_length=300)] = ""
    use_model: bool = False
    created_at: Timestamp | None = None


def check_user_id(user_id: Any) -> str:
    if not isinstance(user_id, str) or not user_id.strip() or len(user_id) > MAX_ID_CHARS \
            or any(ch.isspace() for ch in user_id):
        raise ValueError("a user id (open_id such as ou_…) is required, without spaces")
    return user_id
