"""Layer 3: the user profile — one Markdown document per user, in seven fixed sections.

The document is stored as rows of ``profile_entries`` (one bullet each, with its
section, position, visibility and provenance) and rendered in the spec's order::

    # 用户画像                  (title: the console document only, not the prompt)

    ## 基础特征
    - 名字叫林一，30 岁

    ## 目标与方向
    - 2026 年底前完成独立产品上线

Sections (``SECTIONS``): 基础特征, 身份与背景, 目标与方向, 工作与沟通方式, 心理与情绪,
个人语言与激励, 与 Agent 的约定. English aliases are accepted where a section is named
(``basics``, ``identity``, ``goals``, ``work style``, ``psychology``, ``language``,
``agreements`` …); an unknown name is refused with ``ProfileError`` listing the sections.

Entries are inert data
----------------------
An entry is one line of at most ``MAX_ENTRY_CHARS`` characters. It is refused (a
``ProfileError`` the tool layer returns to the model as an error, so it can retry) when
it spans several lines, starts a heading (``#``), a list-marker chain (``- - x``,
``* x``, ``1. x``), contains a code fence (```` ``` ```` / ``~~~``), or has no words at
all (``---``). One leading ``- `` the model adds by habit is dropped. Angle brackets
are *neutralised*, not refused: ``<`` and ``>`` are stored as the full-width ``＜`` and
``＞``, so ``</user_profile>`` can never close the prompt's tag (the prompt assembler
escapes as well). Control and zero-width characters are removed.

Write modes (``update``)
------------------------
* ``append`` — a bullet at the end of the section (an identical bullet is not repeated).
* ``overwrite`` — the section becomes this one bullet.
* ``merge`` — if an existing bullet is similar to the entry or contradicts it, that bullet
  is replaced in place (UPDATE); otherwise the entry is added (ADD). "Similar" is
  ``memory.text.similarity.similarity`` (character-bigram Dice on normalised text, the same for
  Chinese and English) ≥ ``MERGE_THRESHOLD`` (``similarity.RELATED`` = 0.5): 喜欢咖啡 vs
  不喜欢咖啡, "prefers short answers" vs "prefers detailed answers". "Contradicting" is
  detected lexically as the same label before a colon: ``常住城市：北京`` vs
  ``常住城市：上海``. Anything subtler is the model's job: it should phrase the new
  bullet like the one it replaces.

In a group chat the model sees only the user's shared entries, so ``overwrite`` and
``merge`` act only on those; entries learned in the user's p2p chat stay.

Visibility and provenance
-------------------------
An entry learned in a p2p chat is ``private`` (shown only in that user's p2p chat); one
learned in a group, or typed by the user (``source="user_edit"``), is ``shared``. Each
entry keeps its source (``agent_proactive`` | ``consolidator`` | ``user_edit``), chat,
message id and times. Writes go to ``scope.user_id`` only.

``profile_sources`` records which sessions taught each entry (like ``fact_sources`` for
facts): the session of the tool call or of the extraction that wrote it, and every session
that wrote it again word for word. An entry replaced in place (``merge``) now holds the new
session's words, so its sources become that session alone. Deleting a session
(``memory.governance.erase.delete_session``) removes the entries learned only from it; one the user
typed, or one also taught by another session, stays.

基础特征 is never written by background extraction (``source="consolidator"`` is
refused there); ``apply_extraction`` merges psychological entries into 心理与情绪 in
companion mode only.

Injection (``for_prompt``): the sections that have entries, without the title; in a group
chat 心理与情绪 and private entries are left out.

The console's 「我的画像」 page reads the whole document (``read_document``: all seven
headings, empty ones too) and saves it back (``write_document``): validated first, then
applied in one transaction, so a refused document changes nothing.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from storage import Database, serialize, serialize_tx
from memory.queries import Query, run
from memory.scope import Scope
from memory.text.similarity import RELATED, normalise, similarity

log = logging.getLogger(__name__)

BASICS = "基础特征"
IDENTITY = "身份与背景"
GOALS = "目标与方向"
WORK_STYLE = "工作与沟通方式"
PSYCH = "心理与情绪"
LANGUAGE = "个人语言与激励"
AGREEMENTS = "与 Agent 的约定"
SECTIONS: tuple[str, ...] = (BASICS, IDENTITY, GOALS, WORK_STYLE, PSYCH, LANGUAGE, AGREEMENTS)

MODES = ("append", "overwrite", "merge")
SOURCES = ("agent_proactive", "consolidator", "user_edit")
TITLE = "用户画像"

MAX_ENTRY_CHARS = 300
MAX_SECTION_ENTRIES = 30
MAX_DOCUMENT_CHARS = 40_000
MERGE_THRESHOLD = RELATED

_ALIASES_RAW: dict[str, Iterable[str]] = {
    BASICS: ("basics", "basic", "basic traits", "basic info", "traits", "基础", "基本特征", "基本信息"),
    IDENTITY: ("identity", "background", "identity and background", "identity & background", "身份", "背景"),
    GOALS: ("goals", "goal", "direction", "goals and direction", "goals & direction", "目标", "方向"),
    WORK_STYLE: (
        "work style", "working style", "communication", "communication style", "work and communication",
        "work & communication", "work and communication style", "工作方式", "沟通方式", "工作与沟通",
    ),
    PSYCH: ("psychology", "psych", "emotions", "emotion", "psychology and emotions", "mind", "心理", "情绪"),
    LANGUAGE: (
        "language", "personal language", "motivation", "language and motivation",
        "personal language and motivation", "个人语言", "激励",
    ),
    AGREEMENTS: (
        "agreements", "agreement", "agent agreements", "agreements with agent", "agreements with the agent",
        "conventions", "约定", "与agent约定",
    ),
}


def _section_key(name: str) -> str:
    key = unicodedata.normalize("NFKC", name).casefold()
    key = key.strip().lstrip("#").strip().strip("「」『』\"'`*")
    return re.sub(r"[\s_\-]+", "", key)


_ALIASES: dict[str, str] = {}
for _section, _names in _ALIASES_RAW.items():
    for _name in (_section, *_names):
        _ALIASES[_section_key(_name)] = _section


class ProfileError(ValueError):
    """Input refused; the message says why (and is fit to hand back to the model)."""


@dataclass(slots=True)
class ProfileEntry:
    id: int
    user_id: str
    section: str
    position: int
    entry: str
    visibility: str
    source: str
    chat_id: str
    message_id: str
    created_at: float
    updated_at: float


class DocumentWrite(NamedTuple):
    kept: int
    added: int
    removed: int


def valid_sections_text() -> str:
    return "、".join(SECTIONS)


def resolve_section(name: Any) -> str:
    """The section a name (Chinese heading or English alias) stands for, else ProfileError."""
    if isinstance(name, str):
        section = _ALIASES.get(_section_key(name))
        if section:
            return section
    raise ProfileError(f"unknown profile section {str(name)[:60]!r}; the sections are: {valid_sections_text()}")


# --- entries ------------------------------------------------------------------------------

_LINE_BREAKS = re.compile(r"[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
_BULLET = re.compile(r"^-\s+")
_LIST_START = re.compile(r"^(?:[-*+•]|\d{1,9}[.)])(?:\s|$)")
_WORD = re.compile(r"\w", re.UNICODE)
_COLON_KEY = re.compile(r"^\s*([^:：]{1,24}?)\s*[:：]\s*\S")


def _drop_invisible(text: str) -> str:
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch == "\t":
            out.append(" ")
        elif cat == "Cc" or cat == "Cf":
            continue            # control, zero-width and bidi-override characters
        else:
            out.append(ch)
    return "".join(out)


def neutralise(text: str) -> str:
    """Angle brackets become full-width, so no tag can be opened or closed."""
    return text.replace("<", "＜").replace(">", "＞")


def clean_entry(text: Any, *, strip_bullet: bool = True) -> str:
    """An entry fit to store, or ProfileError saying what is wrong with it."""
    if not isinstance(text, str):
        raise ProfileError("an entry must be text")
    text = text.strip()
    if _LINE_BREAKS.search(text):
        raise ProfileError("an entry is one line; send several entries instead of a multi-line one")
    text = _drop_invisible(text).strip()
    if strip_bullet:
        text = _BULLET.sub("", text, count=1).strip()
    if not text:
        raise ProfileError("the entry is empty")
    if len(text) > MAX_ENTRY_CHARS:
        raise ProfileError(f"an entry is at most {MAX_ENTRY_CHARS} characters (this one has {len(text)}); shorten it")
    probe = unicodedata.normalize("NFKC", text)
    if probe.startswith("#"):
        raise ProfileError("an entry cannot start with '#' (sections are fixed; pass the section name separately)")
    if _LIST_START.match(probe):
        raise ProfileError("an entry cannot start with a list marker ('- ', '* ', '1. '); send the text only")
    if "```" in probe or "~~~" in probe:
        raise ProfileError("an entry cannot contain a code fence")
    if not _WORD.search(probe):
        raise ProfileError("the entry has no words")
    return neutralise(text)


def _same_slot(a: str, b: str) -> bool:
    """Same label before a colon: 常住城市：北京 / 常住城市：上海."""
    ma, mb = _COLON_KEY.match(a), _COLON_KEY.match(b)
    return bool(ma and mb and normalise(ma.group(1)) and normalise(ma.group(1)) == normalise(mb.group(1)))


def merge_score(existing: str, new: str) -> float:
    """How strongly ``new`` should replace ``existing`` in merge mode (1.0 for the same slot)."""
    if _same_slot(existing, new):
        return 1.0
    return similarity(existing, new)


# --- the document -------------------------------------------------------------------------


def render(entries: Mapping[str, list[str]], *, include_empty: bool = False, title: bool = False) -> str:
    """The Markdown document, sections in the spec's order."""
    blocks: list[str] = []
    if title:
        blocks.append(f"# {TITLE}")
    for section in SECTIONS:
        items = entries.get(section) or []
        if not items and not include_empty:
            continue
        lines = [f"## {section}"]
        for item in items:
            # Stored entries are already inert; render defensively all the same.
            lines.append("- " + neutralise(_LINE_BREAKS.sub(" ", item)))
        blocks.append("\n".join(lines))
    if not blocks or (title and len(blocks) == 1 and not include_empty):
        return ""
    return "\n\n".join(blocks) + "\n"


_HEADING = re.compile(r"^(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")


def parse_document(markdown: str) -> dict[str, list[str]]:
    """Sections → cleaned entries, or ProfileError naming the line at fault.

    Accepted: an optional ``# title`` before the first section; ``## <section>`` headings
    (the seven, or their aliases, each at most once, in any order); under them ``- ``
    bullets, one entry each, and blank lines. A section left out of the document is empty.
    """
    if not isinstance(markdown, str):
        raise ProfileError("the profile document must be text")
    if len(markdown) > MAX_DOCUMENT_CHARS:
        raise ProfileError(f"the profile document is too long ({len(markdown)} characters; at most {MAX_DOCUMENT_CHARS})")
    result: dict[str, list[str]] = {s: [] for s in SECTIONS}
    seen: dict[str, int] = {}
    current: str | None = None
    title_line = 0
    content_before = False
    for no, raw in enumerate(markdown.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        heading = _HEADING.match(line)
        if heading:
            level, name = len(heading.group(1)), (heading.group(2) or "").strip()
            if level == 1:
                if current is None and not title_line and not content_before:
                    title_line = no
                    continue
                raise ProfileError(f"line {no}: a '# ' title is allowed only once, before the first section")
            if level != 2:
                raise ProfileError(
                    f"line {no}: only '## <section>' headings are allowed; the sections are: {valid_sections_text()}"
                )
            try:
                section = resolve_section(name)
            except ProfileError:
                raise ProfileError(
                    f"line {no}: unknown section {name[:60]!r}; the sections are: {valid_sections_text()}"
                ) from None
            if section in seen:
                raise ProfileError(f"line {no}: section {section} appears twice (first on line {seen[section]})")
            seen[section] = no
            current = section
            continue
        if current is None:
            raise ProfileError(f"line {no}: text before the first section heading ('## {SECTIONS[0]}' …)")
        if not (line == "-" or line.startswith("- ")):
            raise ProfileError(f"line {no}: under a section each line is a '- ' bullet (one entry per line)")
        text = line[1:].strip()
        if not text:
            continue  # an empty bullet left to fill later
        try:
            entry = clean_entry(text, strip_bullet=False)
        except ProfileError as e:
            raise ProfileError(f"line {no}: {e}") from None
        result[current].append(entry)
        if len(result[current]) > MAX_SECTION_ENTRIES:
            raise ProfileError(f"line {no}: section {current} has more than {MAX_SECTION_ENTRIES} entries")
    return result


# --- the store ----------------------------------------------------------------------------

_COLUMNS = "id, user_id, section, position, entry, visibility, source, chat_id, message_id, created_at, updated_at"


def _entry(row: Any) -> ProfileEntry:
    return ProfileEntry(**{k: row[k] for k in row.keys()})


class ProfileStore:
    def __init__(self, db: Database, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock

    # -- writing by the model / the consolidator ---------------------------------------
    async def update(
        self, scope: Scope, section: str, entry: str, mode: str = "append", *, source: str = "agent_proactive",
        session_id: str = "",
    ) -> str:
        """Write one entry to ``scope.user_id``'s profile; a short result for the model.

        ``session_id``: the session that taught it (``profile_sources``; module docs)."""
        section = resolve_section(section)
        if mode not in MODES:
            raise ProfileError(f"unknown mode {str(mode)[:30]!r}; use one of: {', '.join(MODES)}")
        if source not in SOURCES:
            raise ProfileError(f"unknown source {str(source)[:30]!r}")
        if source == "consolidator" and section == BASICS:
            raise ProfileError(f"{BASICS} is written only by the user or when the user states it, never by background extraction")
        text = clean_entry(entry)
        visibility = "shared" if source == "user_edit" else scope.new_visibility
        now = self.clock()

        # Read, compare and write as one Database.write in the SQLite thread (one round trip;
        # the update_profile tool calls this on the reply path).
        def write(tx: Any) -> str:
            serialize(tx, "user", scope.user_id)   # the section is read, compared, then written
            rows = tx.execute(
                "SELECT id, position, entry, visibility FROM profile_entries WHERE user_id = ? AND section = ?"
                " ORDER BY position, id",
                (scope.user_id, section),
            ).fetchall()
            # In a group the model saw (and may change) only the shared entries.
            visible = rows if scope.is_private else [r for r in rows if r["visibility"] == "shared"]
            next_pos = (max(r["position"] for r in rows) + 1) if rows else 0
            provenance = (source, scope.chat_id, scope.message_id)

            def taught(entry_id: int, *, only: bool = False) -> None:
                if not session_id:
                    return
                if only:      # replaced in place: the old words (and where they came from) are gone
                    tx.execute("DELETE FROM profile_sources WHERE entry_id = ?", (entry_id,))
                tx.execute("INSERT OR IGNORE INTO profile_sources(entry_id, session_id) VALUES (?, ?)",
                           (entry_id, session_id))

            def insert(position: int) -> None:
                cur = tx.execute(
                    "INSERT INTO profile_entries(user_id, section, position, entry, visibility, source, chat_id,"
                    " message_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (scope.user_id, section, position, text, visibility, *provenance, now, now),
                )
                taught(int(cur.lastrowid))

            if mode == "overwrite":
                gone = [r["id"] for r in visible]
                if gone:
                    tx.execute(
                        f"DELETE FROM profile_entries WHERE id IN ({', '.join('?' * len(gone))})", gone
                    )
                position = min((r["position"] for r in visible), default=next_pos)
                insert(position)
                return f"{section} now holds this entry" + (f" (replaced {len(gone)})." if gone else ".")

            same = next((r for r in rows if normalise(r["entry"]) == normalise(text)), None)
            if same is not None:
                # Known already: refresh provenance; never narrow a shared entry to private.
                keep_vis = "shared" if "shared" in (same["visibility"], visibility) else "private"
                tx.execute(
                    "UPDATE profile_entries SET entry = ?, visibility = ?, updated_at = ? WHERE id = ?",
                    (text, keep_vis, now, same["id"]),
                )
                taught(same["id"])
                return f"Already in {section}; nothing added."

            if mode == "merge" and visible:
                best = max(visible, key=lambda r: merge_score(r["entry"], text))
                if merge_score(best["entry"], text) >= MERGE_THRESHOLD:
                    tx.execute(
                        "UPDATE profile_entries SET entry = ?, visibility = ?, source = ?, chat_id = ?,"
                        " message_id = ?, updated_at = ? WHERE id = ?",
                        (text, visibility, *provenance, now, best["id"]),
                    )
                    taught(best["id"], only=True)
                    return f"Updated in {section}: replaced {best['entry']!r}."

            if len(rows) >= MAX_SECTION_ENTRIES:
                raise ProfileError(
                    f"{section} is full ({MAX_SECTION_ENTRIES} entries); use mode 'merge' to replace a similar "
                    "entry or 'overwrite' to rewrite the section"
                )
            insert(next_pos)
            return f"Added to {section}."

        return await self.db.write(write)

    async def apply_extraction(self, scope: Scope, entries: Iterable[Any], *, companion: bool,
                               session_id: str = "") -> int:
        """Merge background psychological extraction into 心理与情绪 — companion mode only.

        ``entries``: strings, or the consolidator's ``{"entry": ...}`` objects. Invalid ones are
        skipped. Returns how many were written (0 in work mode).
        """
        if not companion:
            return 0
        written = 0
        for item in entries:
            text = item.get("entry") if isinstance(item, Mapping) else item
            try:
                await self.update(scope, PSYCH, text, "merge", source="consolidator", session_id=session_id)
            except ProfileError as e:
                log.info("profile extraction skipped: %s", e)
                continue
            written += 1
        return written

    # -- reading ------------------------------------------------------------------------
    async def for_prompt(self, scope: Scope) -> str:
        """The document for ``<user_profile>``: non-empty sections only, '' if none.

        In a group chat: no 心理与情绪, no private (p2p-learned) entries.
        """
        return await run(self.db, self.for_prompt_query(scope))

    def for_prompt_query(self, scope: Scope) -> Query[str]:
        sql = (
            "SELECT section, entry FROM profile_entries WHERE user_id = ?"
            f" AND {scope.visible_sql('visibility')}"
        )
        params: list[Any] = [scope.user_id]
        if not scope.is_private:
            sql += " AND section <> ?"
            params.append(PSYCH)
        return Query(((sql + " ORDER BY position, id", tuple(params)),), lambda rows: render(_group(rows[0])))

    async def read_document(self, user_id: str) -> str:
        """The whole document for the console: title and all seven headings, even empty ones."""
        rows = await self.db.fetchall(
            "SELECT section, entry FROM profile_entries WHERE user_id = ? ORDER BY position, id", (user_id,)
        )
        return render(_group(rows), include_empty=True, title=True)

    async def export_document(self, user_id: str) -> str:
        """user_profile.md for ``ethan memory export``: the sections that have entries."""
        rows = await self.db.fetchall(
            "SELECT section, entry FROM profile_entries WHERE user_id = ? ORDER BY position, id", (user_id,)
        )
        return render(_group(rows), title=True)

    async def list(self, user_id: str) -> list[ProfileEntry]:
        rows = await self.db.fetchall(
            f"SELECT {_COLUMNS} FROM profile_entries WHERE user_id = ? ORDER BY position, id", (user_id,)
        )
        order = {s: i for i, s in enumerate(SECTIONS)}
        return sorted((_entry(r) for r in rows), key=lambda e: (order.get(e.section, 99), e.position, e.id))

    # -- the console's editor -------------------------------------------------------------
    async def write_document(self, user_id: str, markdown: str) -> DocumentWrite:
        """Replace the user's profile with ``markdown`` (validated, then one transaction).

        Entries kept word for word keep their provenance and visibility; new ones are
        ``user_edit`` and shared; entries no longer in the document are removed.
        """
        parsed = parse_document(markdown)
        now = self.clock()
        async with self.db.transaction() as tx:
            await serialize_tx(tx, "user", user_id)
            cur = await tx.execute(
                "SELECT id, section, entry FROM profile_entries WHERE user_id = ? ORDER BY position, id", (user_id,)
            )
            pool: dict[tuple[str, str], list[int]] = {}
            all_ids: list[int] = []
            for r in await cur.fetchall():
                pool.setdefault((r["section"], r["entry"]), []).append(r["id"])
                all_ids.append(r["id"])
            await cur.close()
            kept: set[int] = set()
            added = 0
            for section in SECTIONS:
                for position, text in enumerate(parsed[section]):
                    ids = pool.get((section, text))
                    if ids:
                        rid = ids.pop(0)
                        kept.add(rid)
                        await tx.execute("UPDATE profile_entries SET position = ? WHERE id = ?", (position, rid))
                    else:
                        added += 1
                        await tx.execute(
                            "INSERT INTO profile_entries(user_id, section, position, entry, visibility, source,"
                            " chat_id, message_id, created_at, updated_at)"
                            " VALUES (?, ?, ?, ?, 'shared', 'user_edit', '', '', ?, ?)",
                            (user_id, section, position, text, now, now),
                        )
            gone = [i for i in all_ids if i not in kept]
            for i in range(0, len(gone), 500):
                chunk = gone[i : i + 500]
                await tx.execute(f"DELETE FROM profile_entries WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
        return DocumentWrite(kept=len(kept), added=added, removed=len(gone))

    async def get(self, user_id: str, entry_id: int) -> ProfileEntry | None:
        row = await self.db.fetchone(f"SELECT {_COLUMNS} FROM profile_entries WHERE user_id = ? AND id = ?",
                                     (user_id, int(entry_id)))
        return _entry(row) if row else None

    async def correct(self, scope: Scope, entry_id: int, text: str) -> ProfileEntry | None:
        """The user's correction of one entry (the /memory card's Correct): its words replaced
        in place, now the user's (``user_edit``), learned here; None when they have no such entry."""
        clean = clean_entry(text)
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE profile_entries SET entry = ?, source = 'user_edit', chat_id = ?, message_id = ?,"
                " updated_at = ? WHERE user_id = ? AND id = ?",
                (clean, scope.chat_id, scope.message_id, self.clock(), scope.user_id, int(entry_id)))
            changed = cur.rowcount
            await cur.close()
        return await self.get(scope.user_id, entry_id) if changed else None

    async def delete_all(self, user_id: str) -> int:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM profile_entries WHERE user_id = ?", (user_id,))
            return cur.rowcount


def _group(rows: Iterable[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["section"], []).append(r["entry"])
    return out
