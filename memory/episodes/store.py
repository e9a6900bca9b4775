"""Layer 4: episodic memory — one keyworded summary per finished session, per user.

When a session ends with at least two user turns, ``EpisodeStore.write`` keeps one
*episode* per participating user: the spec's record (session_id, summary, timestamp,
model, turn_count, keywords) plus its scope (user_id, chat_id, chat_type, visibility —
an episode of a p2p chat is ``private``). Writing is idempotent per (user, session):
a resumed session that ends again updates its episode.

The rest of the layer, each in its module: the words (memory/episodes/keywords.py), the record
(record.py), the engines' rankings (search.py), recall's decisions (recall.py) and its semantic
half (semantic.py), what recall injects within its budget (evidence.py); the vectors
(vectors.py, embedding.py), chunks (chunks.py) and relative dates (reltime.py).

Index (schema v4)
-----------------
``episodes.terms``: the summary's and keywords' search terms *with their repeats* (term
frequency kept), under FTS5 ``episodes_fts``. ``episode_chunks``: what the users said in the
session, ``CHUNK_LINES`` lines per chunk overlapping by one, each with its terms under
``episode_chunks_fts``. Only user lines (an assistant answer restates memory injected from
other sessions). ``started_at`` / ``ended_at``: the session's first and last message.
PostgreSQL: GIN indexes over ``term_array`` (``terms`` split, a stored column) of both tables, and
``episode_index_stats`` (schema v9) for BM25's row count and term total; ``_bm25_rows``
(search.py) computes FTS5's bm25() there, so both engines give the same rankings (docs/memory.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterable

from storage import Database
from memory.episodes.chunks import CHUNK_LINES, CHUNK_STRIDE
from memory.episodes.embedding import Embedder
from memory.episodes.keywords import MAX_QUERY_TERMS, _clean_keywords, extract_keywords
from memory.episodes.recall import EpisodeRecall
from memory.episodes.record import _COLUMNS, _E_COLUMNS, Episode, _row, _where
from memory.episodes.reltime import day_of, resolve
from memory.episodes.search import DEFAULT_METHOD, METHODS, _ranked, _tf_score
from memory.episodes.semantic import QUERY_EMBED_TIMEOUT_S
from memory.scope import PRIVATE_CHAT_TYPES, Scope
from memory.text.tokenizer import index_terms, is_warm, search_terms


MIN_TURNS = 2              # a session with fewer user turns leaves no episode
MAX_SUMMARY_CHARS = 4000
MAX_IMPORT_SUMMARY_CHARS = 100_000   # an import accepts long text (cut to MAX_SUMMARY_CHARS, not refused)
MAX_BODY_LINES = 400       # turns indexed per session (the newest kept beyond this)
MAX_BODY_LINE_CHARS = 1000


def chunk_lines(lines: Iterable[str]) -> list[str]:
    """A session's turn lines cut into overlapping chunks of ``CHUNK_LINES`` lines."""
    clean = [" ".join(str(l).split())[:MAX_BODY_LINE_CHARS] for l in lines]
    clean = [l for l in clean if l][-MAX_BODY_LINES:]
    if not clean:
        return []
    out = []
    for start in range(0, len(clean), CHUNK_STRIDE):
        out.append("\n".join(clean[start:start + CHUNK_LINES]))
        if start + CHUNK_LINES >= len(clean):
            break
    return out


def prepare_chunks(lines: Iterable[str]) -> list[tuple[str, str]]:
    """(text, terms) of each chunk of a session's lines — jieba work, done before any write lock."""
    return [(text, " ".join(index_terms(text))) for text in chunk_lines(lines)]


async def write_chunks(tx: Any, episode_id: int, chunks: list[tuple[str, str]]) -> int:
    """Replace an episode's indexed turns (inside the caller's transaction); returns chunks."""
    await tx.execute("DELETE FROM episode_chunks WHERE episode_id = ?", (int(episode_id),))
    for seq, (text, terms) in enumerate(chunks):
        await tx.execute("INSERT INTO episode_chunks(episode_id, seq, text, terms) VALUES (?, ?, ?, ?)",
                         (int(episode_id), seq, text, terms))
    return len(chunks)


def summary_terms(summary: str, keywords: Iterable[str]) -> str:
    """``episodes.terms`` for a summary and its keywords (repeats kept)."""
    return " ".join(index_terms(summary + "\n" + " ".join(keywords)))


class EpisodeStore(EpisodeRecall):
    def __init__(self, db: Database, *, clock=time.time, embedder: Embedder | None = None,
                 query_timeout: float = QUERY_EMBED_TIMEOUT_S) -> None:
        self.db = db
        self.clock = clock
        self.embedder = embedder
        self.query_timeout = query_timeout
        self.on_written: Any = None       # called after a write (the embedding indexer's nudge)
        self._embed_down_until = 0.0
        self._embed_down = False

    # -- writing ------------------------------------------------------------------------
    async def write(
        self,
        *,
        session_id: str,
        user_id: str,
        chat_id: str = "",
        chat_type: str = "",
        summary: str,
        turn_count: int,
        model: str = "",
        keywords: list[str] | None = None,
        timestamp: float | None = None,
        turns: Iterable[str] | None = None,
        started_at: float | None = None,
        ended_at: float | None = None,
    ) -> Episode | None:
        """Keep the episode of a finished session; ``None`` when there is nothing to keep.

        ``turns``: the session's lines ("speaker: text"), indexed in chunks beside the summary
        (None keeps what an earlier write indexed). Fewer than ``MIN_TURNS`` user turns or an
        empty summary write nothing. A second write for the same (user, session) updates the
        episode (a resumed session that ended again); it stays private if either write was private.
        """
        if not user_id or not session_id:
            raise ValueError("an episode needs a user_id and a session_id")
        summary = (summary or "").strip()
        if turn_count < MIN_TURNS or not summary:
            return None
        if len(summary) > MAX_SUMMARY_CHARS:
            summary = summary[: MAX_SUMMARY_CHARS - 1].rstrip() + "…"
        # "昨天" / "last Saturday" read weeks later mean nothing: the session's date beside them
        day = day_of(ended_at or started_at or timestamp or self.clock())
        summary = resolve(summary, day)
        if turns is not None:
            turns = [resolve(str(t), day) for t in turns]
        if keywords is None:
            keywords = await self._off_loop(extract_keywords, summary)
        else:
            keywords = _clean_keywords(keywords)
        terms = await self._off_loop(summary_terms, summary, keywords)
        # segmenting a long session takes a while: done before taking the write lock
        chunks = await self._off_loop(prepare_chunks, list(turns)) if turns is not None else None
        visibility = "private" if chat_type in PRIVATE_CHAT_TYPES else "shared"
        ts = self.clock() if timestamp is None else float(timestamp)
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO episodes(user_id, session_id, chat_id, chat_type, visibility, summary, keywords,"
                " terms, model, turn_count, timestamp, started_at, ended_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(user_id, session_id) DO UPDATE SET"
                "  summary = excluded.summary, keywords = excluded.keywords, terms = excluded.terms,"
                "  model = excluded.model, turn_count = excluded.turn_count, timestamp = excluded.timestamp,"
                "  started_at = COALESCE(episodes.started_at, excluded.started_at),"
                "  ended_at = COALESCE(excluded.ended_at, episodes.ended_at),"
                "  visibility = CASE WHEN episodes.visibility = 'private' OR excluded.visibility = 'private'"
                "               THEN 'private' ELSE 'shared' END",
                (user_id, session_id, chat_id, chat_type, visibility, summary,
                 json.dumps(keywords, ensure_ascii=False), terms, model, int(turn_count), ts,
                 started_at, ended_at),
            )
            cur = await tx.execute(
                f"SELECT {_COLUMNS} FROM episodes WHERE user_id = ? AND session_id = ?", (user_id, session_id)
            )
            row = await cur.fetchone()
            await cur.close()
            if chunks is not None:
                await write_chunks(tx, row["id"], chunks)
        if self.on_written is not None:
            self.on_written()
        return _row(row)

    # -- reading ------------------------------------------------------------------------
    async def recent(self, user_id: str, n: int = 5, *, scope: Scope | None = None,
                     exclude_session: str | None = None) -> list[Episode]:
        """The user's newest episodes first; with ``scope``, only those it may see (its chat's)."""
        where, params = _where(user_id, scope, exclude_session)
        rows = await self.db.fetchall(
            f"SELECT {_E_COLUMNS} FROM episodes e WHERE {' AND '.join(where)}"
            " ORDER BY e.timestamp DESC, e.id DESC LIMIT ?",
            (*params, max(0, int(n))),
        )
        return [_row(r) for r in rows]

    async def list(self, user_id: str, limit: int = 50, offset: int = 0) -> list[Episode]:
        """The user's episodes, newest first (console, export)."""
        rows = await self.db.fetchall(
            f"SELECT {_COLUMNS} FROM episodes WHERE user_id = ? ORDER BY timestamp DESC, id DESC LIMIT ? OFFSET ?",
            (user_id, max(0, int(limit)), max(0, int(offset))),
        )
        return [_row(r) for r in rows]

    async def get(self, user_id: str, episode_id: int) -> Episode | None:
        row = await self.db.fetchone(
            f"SELECT {_COLUMNS} FROM episodes WHERE user_id = ? AND id = ?", (user_id, int(episode_id))
        )
        return _row(row) if row else None

    async def turns(self, episode_id: int) -> list[str]:
        """The indexed turn lines of an episode, in order (chunk overlaps removed)."""
        rows = await self.db.fetchall(
            "SELECT text FROM episode_chunks WHERE episode_id = ? ORDER BY seq", (int(episode_id),))
        lines: list[str] = []
        for i, r in enumerate(rows):
            part = r["text"].split("\n")
            lines.extend(part if i == 0 else part[CHUNK_LINES - CHUNK_STRIDE:])
        return lines

    async def count(self, user_id: str) -> int:
        row = await self.db.fetchone("SELECT COUNT(*) AS n FROM episodes WHERE user_id = ?", (user_id,))
        return int(row["n"])

    async def search(
        self, user_id: str, query: str, *, limit: int = 5, method: str = DEFAULT_METHOD,
        scope: Scope | None = None, exclude_session: str | None = None,
    ) -> list[Episode]:
        """The user's episodes that best match ``query``, best first.

        ``method``: ``rrf`` (default: reciprocal-rank fusion of BM25 over the summaries and BM25
        over the chunks of turns), ``bm25`` (summaries only), ``turns`` (chunks only), ``tf``
        (the spec's term counting over summaries). With ``scope``, only the episodes that scope
        may see.
        """
        if method not in METHODS:
            raise ValueError(f"unknown search method {method!r}; use one of {', '.join(METHODS)}")
        if scope is not None and scope.user_id != user_id:
            raise ValueError("scope belongs to another user")
        limit = max(0, int(limit))
        if limit == 0:
            return []
        where, params = _where(user_id, scope, exclude_session)
        terms = (await self._off_loop(search_terms, query))[:MAX_QUERY_TERMS]
        if not terms:
            return []
        if method != "tf":
            ranked = await self.db.read(_ranked, where, params, terms, limit, method)
            return [ep for ep, _ in ranked]
        rows = await self.db.fetchall(
            f"SELECT {_E_COLUMNS} FROM episodes e WHERE {' AND '.join(where)}", params
        )
        scored: list[tuple[float, float, int, Any]] = []
        for r in rows:
            ep = _row(r)
            score = _tf_score(terms, ep)
            if score > 0:
                scored.append((score, ep.timestamp, ep.id, ep))
        scored.sort(key=lambda s: (-s[0], -s[1], -s[2]))
        out = []
        for score, _, _, ep in scored[:limit]:
            ep.score = score
            out.append(ep)
        return out
    # -- deleting -----------------------------------------------------------------------
    async def delete(self, user_id: str, episode_id: int) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM episodes WHERE user_id = ? AND id = ?", (user_id, int(episode_id)))
            return cur.rowcount > 0

    async def delete_session(self, session_id: str) -> int:
        """Every user's episode of ``session_id`` (its chunks go with it); returns how many."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM episodes WHERE session_id = ?", (session_id,))
            return cur.rowcount

    async def delete_all(self, user_id: str) -> int:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM episodes WHERE user_id = ?", (user_id,))
            return cur.rowcount

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    async def _off_loop(fn, *args):
        """jieba's first load takes about a second: keep it off the event loop."""
        if is_warm():
            return fn(*args)
        return await asyncio.to_thread(fn, *args)
