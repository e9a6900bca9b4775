"""The cold zone: durable facts about one user, each with a confidence.

Every fact belongs to exactly one user (``scope.user_id``, taken from the event, never from
model arguments) and every read filters ``user_id = ?`` in SQL. Facts learned in a p2p chat
are ``private`` (injected only in that user's p2p chats); facts learned in a group, and facts
the user enters in the console (``user_edit``), are ``shared``.

Outcome: if some active fact is the *same*, the best match is **reinforced** — confidence
``max(old, new)`` plus ``REINFORCE_STEP`` capped at ``MAX_REINFORCED`` (never lowered: a 1.0
user edit stays 1.0), ``hit_count + 1``, ``last_accessed``/``updated_at`` = now, provenance
(chat_id/message_id) kept where it was first learned and the new message added to its sources
(``fact_messages``: every message it was learned from, so a recall of one leaves it while
another remains — memory/governance/withdraw.py; issue 32), ``source`` upgraded to the
more authoritative (user_edit > agent_proactive > consolidator), visibility widened to ``shared``
when the fact is learned again outside p2p, content and category kept. Otherwise the new fact is
**added**. Either way every *contradicted* active fact is **superseded** — kept, with
``superseded_at`` = now and ``superseded_by`` = the surviving fact — never deleted; the new
fact keeps its own visibility (a p2p correction of a shared fact hides the old one in groups
without revealing the new one there).

Capacity: at most ``capacity`` active facts per user (default 500). When an add exceeds it, the
lowest-confidence facts, then the longest-unaccessed, then the oldest are deleted (superseded
history is not counted and not evicted); the fact being written is never evicted.

Injection: ``top(scope, k)`` returns active facts with confidence >= ``MIN_CONFIDENCE`` (0.3),
visible in the scope (outside p2p: ``shared`` only), by confidence DESC, last_accessed DESC,
id; served by the partial indexes ``facts_active`` / ``facts_active_shared``. With ``touch``
their ``last_accessed`` becomes now in one UPDATE. ``hit_count`` is *not* incremented by
injection: it counts re-learning (reinforcement), which is what the spec's 命中 stacks
confidence on; injection happens on every message and would drown it.

Confidence: memory/facts/confidence.py; matching a new fact against the active ones:
memory/facts/matching.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from storage import Database, fetch_one, serialize, serialize_tx
from memory.facts.confidence import USER_EDIT_CONFIDENCE, initial_confidence, reinforced_confidence
from memory.facts.matching import CONTRADICTS, SAME_FACT, _analyse, _relation, corrected_fact
from memory.queries import Query, answer, run
from memory.text.redact import looks_like_secret
from memory.scope import Scope
from memory.text.similarity import RELATED, dice, normalise

CATEGORIES = ("preference", "decision", "knowledge", "correction")
SOURCES = ("consolidator", "agent_proactive", "user_edit")
VISIBILITIES = ("private", "shared")
_AUTHORITY = {"consolidator": 0, "agent_proactive": 1, "user_edit": 2}

DEFAULT_CAPACITY = 500
MAX_CONTENT_CHARS = 500
MIN_CONFIDENCE = 0.3          # injection threshold


class FactError(ValueError):
    """Bad input to the fact store (a message suitable to show the caller or the model)."""


@dataclass(frozen=True, slots=True)
class Fact:
    id: int
    user_id: str
    content: str
    category: str
    confidence: float
    source: str
    visibility: str
    chat_id: str
    message_id: str
    created_at: float
    updated_at: float
    last_accessed: float
    hit_count: int
    superseded_at: float | None = None
    superseded_by: int | None = None

    @property
    def active(self) -> bool:
        return self.superseded_at is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FactWrite:
    fact: Fact
    action: str                          # added | reinforced | superseded
    superseded: tuple[int, ...] = ()     # ids this write superseded
    evicted: tuple[int, ...] = ()        # ids deleted to stay within capacity


_COLUMNS = (
    "id, user_id, content, category, confidence, source, visibility, chat_id, message_id, "
    "created_at, updated_at, last_accessed, hit_count, superseded_at, superseded_by"
)


def _fact(row: Any) -> Fact:
    return Fact(
        id=row["id"], user_id=row["user_id"], content=row["content"], category=row["category"],
        confidence=row["confidence"], source=row["source"], visibility=row["visibility"],
        chat_id=row["chat_id"], message_id=row["message_id"], created_at=row["created_at"],
        updated_at=row["updated_at"], last_accessed=row["last_accessed"],
        hit_count=row["hit_count"], superseded_at=row["superseded_at"],
        superseded_by=row["superseded_by"],
    )


# -- validation -------------------------------------------------------------------------

def clean_content(content: str) -> str:
    """One line, trimmed; ValueError (FactError) if empty, too long or a credential."""
    if not isinstance(content, str):
        raise FactError("fact content must be text")
    text = " ".join(content.split())
    if not text or not normalise(text):
        raise FactError("fact content is empty")
    if len(text) > MAX_CONTENT_CHARS:
        raise FactError(f"fact is too long ({len(text)} characters, at most {MAX_CONTENT_CHARS}); state it in one short sentence")
    if looks_like_secret(text):
        raise FactError("refused: this looks like a password, key or token; credentials are never stored in memory")
    return text


def _check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise FactError(f"unknown category {category!r}; use one of: {', '.join(CATEGORIES)}")
    return category


def _check_confidence(confidence: float) -> float:
    try:
        value = float(confidence)
    except (TypeError, ValueError):
        raise FactError(f"confidence must be a number between 0 and 1, not {confidence!r}") from None
    if not 0.0 <= value <= 1.0:
        raise FactError(f"confidence must be between 0 and 1, not {value}")
    return round(value, 4)


def top_query(scope: Scope, k: int) -> tuple[str, tuple[Any, ...]]:
    """The injection query: served in index order by ``facts_active`` (p2p) or
    ``facts_active_shared`` (elsewhere), no sort step (tests check the query plan)."""
    return (
        f"SELECT {_COLUMNS} FROM facts "
        f"WHERE user_id = ? AND superseded_at IS NULL AND confidence >= ? AND {scope.visible_sql()} "
        "ORDER BY confidence DESC, last_accessed DESC, id ASC LIMIT ?",
        (scope.user_id, MIN_CONFIDENCE, int(k)),
    )


def touch_top_query(scope: Scope, k: int, now: float) -> tuple[str, tuple[Any, ...]]:
    """Mark what ``top_query`` returns as accessed, in SQLite's dialect: an UPDATE of the ids
    the same query selects (run right after it in one write unit, so they are the same rows).
    ``+user_id`` keeps the owner filter but stops the planner from scanning the user's whole
    index instead of looking the ids up by rowid (the idiom wherever ids are listed)."""
    sql, params = top_query(scope, k)
    return (f"UPDATE facts SET last_accessed = ? WHERE +user_id = ? AND id IN (SELECT id FROM ({sql}))",
            (now, scope.user_id, *params))


def _row_sync(conn: Any, user_id: str, fact_id: int) -> Any:
    return conn.execute(f"SELECT {_COLUMNS}, norm FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone()


def _top_and_touch_pg(scope: Scope, k: int, now: float) -> tuple[str, tuple[Any, ...]]:
    """``top_query`` and the touch of what it returns as one PostgreSQL statement: a
    data-modifying CTE (a write unit would be three round trips: SELECT, UPDATE, COMMIT). The
    outer SELECT reads the snapshot before the UPDATE, so the rows come back as found."""
    sql, params = top_query(scope, k)
    return (f"WITH top AS ({sql}), touched AS (UPDATE facts SET last_accessed = ?"
            " WHERE user_id = ? AND id IN (SELECT id FROM top))"
            " SELECT * FROM top ORDER BY confidence DESC, last_accessed DESC, id ASC",
            (*params, now, scope.user_id))


class FactStore:
    def __init__(
        self,
        db: Database,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.db = db
        self.capacity = capacity
        self.clock = clock

    # -- writing ----------------------------------------------------------------------
    async def add(
        self,
        scope: Scope,
        content: str,
        category: str,
        *,
        source: str,
        confidence: float | None = None,
        user_text: str = "",
        importance: float | None = None,
        session_id: str = "",
        decision: tuple[str, int | None] | None = None,
    ) -> FactWrite:
        """Learn a fact for ``scope.user_id``: add, reinforce, and/or supersede (module docs).

        ``session_id``: the session it was learned from (recorded in ``fact_sources``, so
        deleting that session removes the facts learned only from it). ``decision``: the
        extraction model's (action, target id) — ``reinforce`` / ``update`` / ``contradict`` an
        active fact of this user it was shown, applied as given; ``add`` (or a target that is
        not an active fact of the user) falls back to the string rules above."""
        if not scope.user_id:
            raise FactError("no user to store the fact for")
        text = clean_content(content)
        _check_category(category)
        if source not in SOURCES:
            raise FactError(f"unknown source {source!r}; use one of: {', '.join(SOURCES)}")
        if confidence is not None:
            conf = _check_confidence(confidence)
        else:
            conf = initial_confidence(source, user_text=user_text, importance=importance)
        visibility = "shared" if source == "user_edit" else scope.new_visibility
        new = _analyse(text)
        now = self.clock()

        # The whole read-compare-write runs as one Database.write in the SQLite thread (one
        # round trip instead of up to ten; the remember tool calls this on the reply path).
        return await self.db.write(self._add_sync, scope, text, category, source, conf, visibility, new, now,
                                   session_id, decision)

    def _add_sync(self, conn: Any, scope: Scope, text: str, category: str, source: str, conf: float,
                  visibility: str, new: Any, now: float, session_id: str = "",
                  decision: tuple[str, int | None] | None = None) -> FactWrite:
        user = scope.user_id
        serialize(conn, "user", user)    # the match, supersede and evict read all the user's facts
        rows = conn.execute(
            "SELECT id, content, confidence FROM facts WHERE user_id = ? AND superseded_at IS NULL", (user,)
        ).fetchall()

        same: list[tuple[float, float, int]] = []
        contradicted: list[int] = []
        action_of_model, target = decision or ("add", None)
        active_ids = {r["id"]: r for r in rows}
        if action_of_model != "add" and target in active_ids:
            # the model saw this fact and decided: apply it as given (no string rules)
            if action_of_model == "reinforce":
                same = [(1.0, active_ids[target]["confidence"], target)]
            else:                      # update | contradict: the new fact replaces it
                contradicted = [target]
            rows = []
        for row in rows:
            kind, score = _relation(new, _analyse(row["content"]), category)
            if kind == SAME_FACT:
                same.append((score, row["confidence"], row["id"]))
            elif kind == CONTRADICTS:
                contradicted.append(row["id"])

        evicted: tuple[int, ...] = ()
        if same:
            target_id = max(same)[2]
            old = _row_sync(conn, user, target_id)
            assert old is not None
            new_conf = reinforced_confidence(old["confidence"], conf)
            new_source = source if _AUTHORITY[source] > _AUTHORITY[old["source"]] else old["source"]
            new_vis = "shared" if visibility == "shared" else old["visibility"]
            # Provenance stays where the fact was first learned; this learning is one more row
            # of fact_messages (below): a recall of either message leaves the other's (issue 32).
            chat_id, message_id = old["chat_id"], old["message_id"]
            if not message_id and scope.message_id:
                chat_id, message_id = scope.chat_id, scope.message_id
            conn.execute(
                "UPDATE facts SET confidence = ?, source = ?, visibility = ?, chat_id = ?, "
                "message_id = ?, hit_count = hit_count + 1, last_accessed = ?, updated_at = ? "
                "WHERE user_id = ? AND id = ?",
                (new_conf, new_source, new_vis, chat_id, message_id, now, now, user, target_id),
            )
            fact_id, action = target_id, "reinforced"
        else:
            fact_id = int(conn.execute(
                "INSERT INTO facts(user_id, content, norm, category, confidence, source, "
                "visibility, chat_id, message_id, created_at, updated_at, last_accessed, hit_count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (user, text, new.norm, category, conf, source, visibility,
                 scope.chat_id, scope.message_id, now, now, now),
            ).lastrowid)
            action = "superseded" if contradicted else "added"

        if session_id:
            conn.execute("INSERT OR IGNORE INTO fact_sources(fact_id, session_id) VALUES (?, ?)",
                         (fact_id, session_id))
        if scope.message_id:
            conn.execute("INSERT OR IGNORE INTO fact_messages(fact_id, message_id, chat_id, visibility, learned_at)"
                         " VALUES (?, ?, ?, ?, ?)", (fact_id, scope.message_id, scope.chat_id, visibility, now))
        if category == "correction" and action == "added" and not contradicted and rows and decision is None:
            # memory_write {category: correction} states what replaces an earlier fact: the
            # one it corrects is the closest on the words it negates (其实我不在杭州 → 用户在杭州工作)
            target = corrected_fact(text, [(r["id"], r["content"]) for r in rows])
            if target is not None:
                contradicted = [target]
                action = "superseded"
        contradicted = [i for i in contradicted if i != fact_id]
        if contradicted:
            marks = ",".join("?" * len(contradicted))
            conn.execute(
                f"UPDATE facts SET superseded_at = ?, superseded_by = ?, updated_at = ? "
                f"WHERE +user_id = ? AND superseded_at IS NULL AND id IN ({marks})",
                (now, fact_id, now, user, *contradicted),
            )
        if action != "reinforced":
            evicted = self._evict_sync(conn, user, keep=fact_id)
        row = _row_sync(conn, user, fact_id)
        assert row is not None
        return FactWrite(_fact(row), action, tuple(contradicted), evicted)

    async def similar(self, user_id: str, texts: list[str], k: int = 10) -> list[tuple[int, str]]:
        """The user's active facts most similar to ``texts`` (what extraction is shown to decide
        add / reinforce / update / contradict): by shared content words, then character bigrams."""
        rows = await self.db.fetchall(
            "SELECT id, content FROM facts WHERE user_id = ? AND superseded_at IS NULL ORDER BY id", (user_id,))
        if not rows:
            return []
        said = [_analyse(t[:MAX_CONTENT_CHARS]) for t in texts if t.strip()]
        words = frozenset().union(*(a.words for a in said)) if said else frozenset()
        grams = set().union(*(a.grams for a in said)) if said else set()
        scored = []
        for r in rows:
            a = _analyse(r["content"])
            shared = len(a.words & words)
            score = (shared, dice(a.grams, grams) if grams else 0.0)
            if shared or score[1] >= RELATED / 2:
                scored.append((score, r["id"], r["content"]))
        scored.sort(key=lambda x: (-x[0][0], -x[0][1], x[1]))
        return [(i, c) for _, i, c in scored[:k]]

    def _evict_sync(self, conn: Any, user_id: str, *, keep: int) -> tuple[int, ...]:
        (active,) = conn.execute(
            "SELECT COUNT(*) FROM facts WHERE user_id = ? AND superseded_at IS NULL", (user_id,)
        ).fetchone()
        excess = active - self.capacity
        if excess <= 0:
            return ()
        ids = tuple(r[0] for r in conn.execute(
            "SELECT id FROM facts WHERE user_id = ? AND superseded_at IS NULL AND id != ? "
            "ORDER BY confidence ASC, last_accessed ASC, id ASC LIMIT ?",
            (user_id, keep, excess),
        ).fetchall())
        if ids:
            marks = ",".join("?" * len(ids))
            conn.execute(f"DELETE FROM facts WHERE +user_id = ? AND id IN ({marks})", (user_id, *ids))
        return ids

    @staticmethod
    async def _row(conn: Any, user_id: str, fact_id: int) -> Any:
        return await fetch_one(conn, f"SELECT {_COLUMNS}, norm FROM facts WHERE user_id = ? AND id = ?",
                               (user_id, fact_id))

    async def update(
        self,
        user_id: str,
        fact_id: int,
        *,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
        visibility: str | None = None,
    ) -> Fact | None:
        """The user's own edit (console): in place, source becomes ``user_edit``.

        New content without an explicit confidence sets confidence to 1.0 (the user said so).
        Returns None when the user has no such fact.
        """
        sets: dict[str, Any] = {}
        if content is not None:
            text = clean_content(content)
            sets.update(content=text, norm=normalise(text))
            if confidence is None:
                sets["confidence"] = USER_EDIT_CONFIDENCE
        if category is not None:
            sets["category"] = _check_category(category)
        if confidence is not None:
            sets["confidence"] = _check_confidence(confidence)
        if visibility is not None:
            if visibility not in VISIBILITIES:
                raise FactError(f"unknown visibility {visibility!r}; use private or shared")
            sets["visibility"] = visibility
        if not sets:
            return await self.get(user_id, fact_id)
        sets.update(source="user_edit", updated_at=self.clock())
        assignments = ", ".join(f"{k} = ?" for k in sets)
        async with self.db.transaction() as tx:
            await serialize_tx(tx, "user", user_id)   # not between an add's read and its write
            cur = await tx.execute(
                f"UPDATE facts SET {assignments} WHERE user_id = ? AND id = ?",
                (*sets.values(), user_id, fact_id),
            )
            changed = cur.rowcount
            await cur.close()
            row = await self._row(tx, user_id, fact_id) if changed else None
        return _fact(row) if row else None

    async def delete(self, user_id: str, fact_id: int) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id))
            n = cur.rowcount
            await cur.close()
        return n > 0

    async def delete_all(self, user_id: str) -> int:
        """Every fact of the user, superseded history included."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
            n = cur.rowcount
            await cur.close()
        return n

    # -- reading ----------------------------------------------------------------------
    async def top(self, scope: Scope, k: int = 15, *, touch: bool = True) -> list[Fact]:
        """The facts to inject for this request (module docs); fast path uses k=5."""
        return await run(self.db, self.top_read(scope, k, touch=touch))

    def top_read(self, scope: Scope, k: int = 15, *, touch: bool = True) -> Query[list[Fact]]:
        """``top`` as a Query (memory/queries.py): with ``touch``, what it returns is marked
        accessed in the same round trip — on every message, so never a unit of its own."""
        if k <= 0 or not scope.user_id:
            return answer([])
        if not touch:
            return Query((top_query(scope, k),), lambda rows: [_fact(r) for r in rows[0]])
        now = self.clock()

        def touched(rows: list[list[Any]]) -> list[Fact]:
            return [replace(_fact(r), last_accessed=now) for r in rows[0]]
        if self.db.dialect == "postgres":
            return Query((_top_and_touch_pg(scope, k, now),), touched, writes=True)
        return Query((top_query(scope, k), touch_top_query(scope, k, now)), touched, writes=True)

    async def get(self, user_id: str, fact_id: int) -> Fact | None:
        row = await self.db.fetchone(
            f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)
        )
        return _fact(row) if row else None

    async def sources(self, user_id: str, fact_ids: list[int]) -> dict[int, list[tuple[str, str, float]]]:
        """Every message each fact was learned from: {fact_id: [(chat_id, message_id, learned_at)]},
        oldest first (facts of ``user_id`` only; ids without a row are absent)."""
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        rows = await self.db.fetchall(
            "SELECT m.fact_id, m.chat_id, m.message_id, m.learned_at FROM fact_messages m"
            f" JOIN facts f ON f.id = m.fact_id WHERE f.user_id = ? AND m.fact_id IN ({marks})"
            " ORDER BY m.learned_at, m.message_id", (user_id, *fact_ids))
        out: dict[int, list[tuple[str, str, float]]] = {}
        for r in rows:
            out.setdefault(int(r["fact_id"]), []).append((r["chat_id"], r["message_id"], r["learned_at"]))
        return out

    async def list(self, user_id: str, *, include_superseded: bool = False) -> list[Fact]:
        """Active facts by rank; with history, superseded ones follow, newest first."""
        active = [
            _fact(r)
            for r in await self.db.fetchall(
                f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND superseded_at IS NULL "
                "ORDER BY confidence DESC, last_accessed DESC, id ASC",
                (user_id,),
            )
        ]
        if not include_superseded:
            return active
        history = await self.db.fetchall(
            f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND superseded_at IS NOT NULL "
            "ORDER BY superseded_at DESC, id DESC",
            (user_id,),
        )
        return active + [_fact(r) for r in history]

    async def count(self, user_id: str, *, include_superseded: bool = False) -> int:
        sql = "SELECT COUNT(*) AS n FROM facts WHERE user_id = ?"
        if not include_superseded:
            sql += " AND superseded_at IS NULL"
        row = await self.db.fetchone(sql, (user_id,))
        return int(row["n"]) if row else 0
