"""Session search: an FTS5 trigram index over message content (substring match, any script),
plus the session titles; ranked by bm25, then recency, one hit per session.

Queries shorter than three characters cannot use trigrams and scan with LIKE instead, ranked
with bm25's own term-frequency and length factors; so do scoped searches over few messages
when the term is common elsewhere (see ``search_sessions``). The query is always matched
literally: FTS syntax (``"`` ``*`` ``NEAR`` ``-`` ``(`` ``:``) and LIKE wildcards (``%``
``_``) mean themselves. ``SessionStore.search`` (memory/sessions/store.py) is the entry point, with
its visibility filter. Measured in ``bench/bench_session_search.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from storage import Database

MIN_FTS_CHARS = 3          # the trigram tokenizer matches substrings of at least 3 characters
SNIPPET_CHARS = 80
SCAN_LIMIT = 20_000        # scoped searches over at most this many messages may scan them
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's bm25 constants
DEFAULT_AVG_TOKENS = 60.0


@dataclass(frozen=True, slots=True)
class SearchHit:
    session: Any              # memory.sessions.records.SessionInfo
    snippet: str              # the best matching message (or the title) around the match
    score: float              # relevance of the best match, higher is better (fts: -bm25; like:
                              # bm25 without the IDF); comparable within one result list
    message_id: int | None    # the message the snippet comes from; None for a title-only hit
    matches: int              # matching messages in the session
    method: str               # "fts" | "like"


class EmptyQuery(ValueError):
    def __init__(self) -> None:
        super().__init__("empty query: type a word or phrase to search for")



def fts_phrase(query: str) -> str:
    """The query as one FTS5 phrase: every character literal, quotes doubled."""
    return '"' + query.replace('"', '""') + '"'


def like_pattern(query: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching the query anywhere, literally."""
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def make_snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    at = flat.lower().find(query.lower())
    if at < 0 or len(flat) <= width:
        return flat if len(flat) <= width else flat[:width] + "…"
    start = max(0, min(at - (width - len(query)) // 2, len(flat) - width))
    end = start + width
    return ("…" if start > 0 else "") + flat[start:end] + ("…" if end < len(flat) else "")


async def search_sessions(
    db: Database,
    query: str,
    *,
    where: str,
    params: Sequence[Any],
    session_cols: str,
    to_session: Callable[[Any], Any],
    limit: int = 20,
    method: str = "auto",
    scan_limit: int = SCAN_LIMIT,
) -> list[SearchHit]:
    """Sessions whose messages or title contain ``query`` (literally), best first:
    by relevance (bm25), then by recency; one hit per session.

    ``where``/``params``: the visibility filter over ``sessions s`` (SessionStore's; empty
    params = unscoped); ``session_cols``/``to_session``: the session columns and their row
    reader. ``method``:

    * "fts": the trigram index (queries of 3+ characters);
    * "like": a scan with LIKE, ranked with bm25's term-frequency and length factors
      (the phrase's IDF is the same for every row, so the order is bm25's);
    * "auto" (default): "like" for queries under 3 characters, and for scoped
      searches over at most ``scan_limit`` messages when the term is common in the
      whole table (more matches than a quarter of the visible messages: the index
      would rank and join every one of them); else "fts".

    Scores are comparable within one result list only. LIKE folds ASCII case only;
    the trigram index folds Unicode case too. Raises EmptyQuery (a ValueError) for an
    empty or blank query, ValueError for "fts" with a query under 3 characters.
    """
    q = (query or "").replace("\x00", "").strip()   # SQLite would cut a pattern at NUL
    if not q:
        raise EmptyQuery()
    if method not in ("auto", "fts", "like"):
        raise ValueError(f"unknown search method {method!r}")
    if method == "fts" and len(q) < MIN_FTS_CHARS:
        raise ValueError(f"full-text search needs at least {MIN_FTS_CHARS} characters")
    limit = max(1, int(limit))
    params = list(params)
    scoped = bool(params)
    if method == "auto":
        method = "fts"
        if len(q) < MIN_FTS_CHARS:
            method = "like"
        elif scoped and db.dialect == "sqlite":
            row = await db.fetchone(
                f"SELECT COALESCE(SUM(s.message_count), 0) FROM sessions s WHERE {where}", params
            )
            visible = int(row[0])
            if visible <= scan_limit:
                # Index cost grows with the matches in the whole table, scan cost with
                # the visible messages: count matches, but only up to a quarter of them.
                cap = visible // 4 + 1
                row = await db.fetchone(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)",
                    (fts_phrase(q), cap),
                )
                if row[0] >= cap:
                    method = "like"

    if db.dialect == "postgres":
        # One query for both methods: pg_trgm's GIN index serves ILIKE for 3+ characters
        # (SQLite's trigram table) and PostgreSQL scans for fewer; bm25's factors as below
        # (the phrase's IDF is the same for every row, so the order is FTS5's bm25 order).
        message_rows = await db.read(_pg_message_rows, q, where, params, session_cols, scoped, limit)
    elif method == "fts":
        message_rows = await db.fetchall(
            "WITH hits AS MATERIALIZED ("
            "  SELECT m.session_id AS sid, m.id AS mid, -bm25(messages_fts) AS score"
            "  FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
            f"  {'JOIN sessions s ON s.id = m.session_id' if scoped else ''}"
            f"  WHERE messages_fts MATCH ? AND {where}"
            "), best AS ("
            "  SELECT sid, MAX(score) AS score, mid, COUNT(*) AS n FROM hits GROUP BY sid"
            f") SELECT best.score, best.mid, best.n, {session_cols} FROM best JOIN sessions s ON s.id = best.sid"
            " ORDER BY best.score DESC, s.updated_at DESC, s.id DESC LIMIT ?",
            [fts_phrase(q), *params, limit],
        )
    else:
        # Scoped: walk the visible sessions' messages (CROSS JOIN fixes that order);
        # unscoped: scan all messages. f = occurrences, dl = trigram count of the row.
        source = "sessions s CROSS JOIN messages m ON m.session_id = s.id" if scoped else "messages m"
        message_rows = await db.fetchall(
            "WITH hits AS MATERIALIZED ("
            "  SELECT m.session_id AS sid, m.id AS mid,"
            "         max(1.0, (length(lower(m.content)) - length(replace(lower(m.content), lower(?), '')))"
            "                  * 1.0 / length(?)) AS f,"
            "         max(1, length(m.content) - 2) AS dl"
            f"  FROM {source} WHERE m.content LIKE ? ESCAPE '\\' AND {where}"
            "), best AS ("
            f"  SELECT sid, MAX(f * {BM25_K1 + 1} / (f + {BM25_K1} * ({1 - BM25_B} + {BM25_B} * dl / ?)))"
            "         AS score, mid, COUNT(*) AS n FROM hits GROUP BY sid"
            f") SELECT best.score, best.mid, best.n, {session_cols} FROM best JOIN sessions s ON s.id = best.sid"
            " ORDER BY best.score DESC, s.updated_at DESC, s.id DESC LIMIT ?",
            [q, q, like_pattern(q), *params, await _avg_doc_tokens(db), limit],
        )
    # A title is the first user message with its whitespace folded, so a query without
    # whitespace that matches a title also matches that message: only queries with
    # whitespace need the titles searched (a scan of the sessions table).
    title_rows = []
    if any(ch.isspace() for ch in q):
        title_rows = await db.fetchall(
            f"SELECT {session_cols} FROM sessions s WHERE s.title LIKE ? ESCAPE '\\' AND {where} "
            "ORDER BY s.updated_at DESC, s.id DESC LIMIT ?",
            [like_pattern(q), *params, limit],
        )

    contents: dict[int, str] = {}
    mids = [r["mid"] for r in message_rows]
    if mids:
        contents = {
            r["id"]: r["content"]
            for r in await db.fetchall(
                "SELECT id, content FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(mids),),
            )
        }
    hits: list[SearchHit] = []
    for r in message_rows:
        hits.append(SearchHit(
            to_session(r), make_snippet(contents.get(r["mid"], ""), q), float(r["score"]), r["mid"], r["n"], method
        ))
    seen = {h.session.id for h in hits}
    for r in title_rows:   # titles that match where no message does (whitespace folded)
        info = to_session(r)
        if info.id not in seen:
            hits.append(SearchHit(info, make_snippet(info.title, q), 0.0, None, 0, method))
    hits.sort(key=lambda h: (-h.score, -h.session.updated_at))
    return hits[:limit]

_PG_MESSAGE_HITS = (
    "WITH hits AS MATERIALIZED ("
    "  SELECT m.session_id AS sid, m.id AS mid,"
    "         GREATEST(1.0, (length(lower(m.content)) - length(replace(lower(m.content), lower(?::text), '')))"
    "                  * 1.0 / length(?::text)) AS f,"
    "         GREATEST(1, length(m.content) - 2) AS dl"
    "  FROM {source} WHERE m.content LIKE ? ESCAPE '\\' AND {where}"
    "), scored AS ("
    f"  SELECT sid, mid, f * {BM25_K1 + 1} / (f + {BM25_K1} * ({1 - BM25_B} + {BM25_B} * dl / ?)) AS score,"
    "         COUNT(*) OVER (PARTITION BY sid) AS n FROM hits"
    "), best AS ("
    "  SELECT DISTINCT ON (sid) sid, score, mid, n FROM scored ORDER BY sid, score DESC, mid"
    ") SELECT best.score, best.mid, best.n, {cols} FROM best JOIN sessions s ON s.id = best.sid"
    " ORDER BY best.score DESC, s.updated_at DESC, s.id DESC LIMIT ?"
)


def _pg_message_rows(conn: Any, q: str, where: str, params: list, session_cols: str, scoped: bool,
                     limit: int) -> list:
    """Run by Database.read on PostgreSQL: the best matching message of each session."""
    # FTS5's statistic: trigrams per message (length - 2), averaged over the table.
    avg = conn.execute("SELECT AVG(GREATEST(1, length(content) - 2)) FROM messages").fetchone()[0]
    source = "sessions s JOIN messages m ON m.session_id = s.id" if scoped else "messages m"
    sql = _PG_MESSAGE_HITS.format(source=source, where=where, cols=session_cols)
    return conn.execute(sql, [q, q, like_pattern(q), *params, float(avg or DEFAULT_AVG_TOKENS), limit]).fetchall()


async def _avg_doc_tokens(db: Database) -> float:
    """Average tokens per message, from the FTS index's own statistics (its
    'averages' record: varint row count, varint token count), as bm25 uses it."""
    row = await db.fetchone("SELECT block FROM messages_fts_data WHERE id = 1")
    try:
        rows, at = _varint(row[0], 0)
        tokens, _ = _varint(row[0], at)
        return tokens / rows if rows > 0 and tokens > 0 else DEFAULT_AVG_TOKENS
    except (TypeError, IndexError):
        return DEFAULT_AVG_TOKENS


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    """SQLite's variable-length integer (big-endian 7-bit groups; a 9th byte has 8 bits)."""
    value = 0
    for i in range(8):
        byte = buf[at + i]
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at + i + 1
    return (value << 8) | buf[at + 8], at + 9
