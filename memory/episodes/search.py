"""Episode search: the index's rankings, on SQLite (FTS5) and on PostgreSQL (the same BM25).

The engine-specific SQL of the episode index and how its rankings are fused: ``_bm25_rows``
(FTS5's bm25() on SQLite; ``pg_bm25_query``, the same arithmetic in one statement over the GIN
indexes, on PostgreSQL), ``_ranked`` (a search method's ranking, RRF by default), ``_word_dfs``
(recall's document frequencies) and the spec's ``tf`` scoring (``_tf_score``). Functions run by
``Database.read`` on a connection; apart from the store (which writes) and from recall (which
decides) because this is where the two engines differ and must give the same order
(tests/memory/test_episode_parity.py).

Search
------
Methods, all filtered by ``user_id`` (and, for recall, where the chat may see it) in SQL:
``"rrf"`` (default) — reciprocal-rank fusion (k = 60) of BM25 over the summaries and BM25 over
the chunks (best chunk per episode); ``"bm25"`` — summaries only (the old default);
``"turns"`` — chunks only; ``"tf"`` — the spec's term counting over summaries. Measured on the
generated labelled set (``tests/memory/recall_corpus.py``; summaries = a session's first two
lines, the details said mid-session): r@3 rrf 0.961, turns 0.961, bm25 0.594, tf 0.602
(``bench/bench_recall.py``). On the hand-written summaries-only set
(``tests/memory/episodes_labelled.py``) rrf equals bm25.
"""

from __future__ import annotations

from typing import Any, Iterable

from storage import dialect_of
from memory.episodes.record import _COLUMNS, Episode, _row
from memory.text.tokenizer import prepare as _prepare


KEYWORD_WEIGHT = 2         # tf method: a query word that is an episode keyword counts this much more
METHODS = ("rrf", "bm25", "turns", "tf")
DEFAULT_METHOD = "rrf"
RRF_K = 60                 # reciprocal-rank fusion constant (Cormack et al.)
RANK_DEPTH = 50            # how deep each ranking (summary, turns) is read before fusion


def _fts_query(terms: Iterable[str]) -> str:
    # Our terms are word characters only; quoting keeps FTS5 operators (AND, NOT, NEAR) inert.
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


# BM25 as FTS5's bm25() computes it (fts5_aux.c), for PostgreSQL's branch: k1 = 1.2, b = 0.75.
BM25_K1 = 1.2
BM25_B = 0.75
BM25_IDF_FLOOR = 1e-6      # FTS5: a term in more than half the rows gets this idf, not a negative one

# One statement per ranking on PostgreSQL. Term sets as arrays: ``term_array`` (the terms split
# at write time, schema v9) carries the GIN indexes (&& finds the rows holding any query term,
# @> counts one term's rows). The arithmetic is FTS5's, operation
# for operation in float8 (its C code's order of evaluation, the phrases summed in query order),
# so the scores are the same numbers and the ranking the same order:
#   idf(t)  = ln((N - n(t) + 0.5) / (n(t) + 0.5)), at least BM25_IDF_FLOOR
#   score   = Σ idf(t) · tf·(k1 + 1) / (tf + k1·(1 − b + b·|D| / avgdl))
# N, avgdl and n(t) over the whole table (every user's rows), as FTS5 counts them: N and the
# token total from episode_index_stats (schema v9), n(t) from the GIN index.
_PG_BM25 = """
WITH st AS (SELECT n_rows::float8 AS n_rows, n_tokens::float8 / GREATEST(n_rows, 1)::float8 AS avgdl
              FROM episode_index_stats WHERE name = '{table}'),
q(term, ord, n) AS (VALUES {counts}),
idf AS (
    SELECT q.term, q.ord, CASE WHEN x.v <= 0 THEN ?::float8 ELSE x.v END AS idf
      FROM q CROSS JOIN st
      CROSS JOIN LATERAL (SELECT ln((st.n_rows - q.n + 0.5::float8) / (q.n + 0.5::float8)) AS v) x),
hit AS ({hits})
SELECT {cols}, SUM(idf.idf * ((f.tf * (?::float8 + 1.0::float8))
                              / (f.tf + ?::float8 * (1.0::float8 - ?::float8
                                                     + ?::float8 * cardinality(h.arr)::float8 / st.avgdl)))
                   ORDER BY idf.ord) AS score
  FROM hit h CROSS JOIN st CROSS JOIN idf
  CROSS JOIN LATERAL (SELECT cardinality(array_positions(h.arr, idf.term))::float8 AS tf) f
 WHERE f.tf > 0
 GROUP BY {cols}, h.timestamp
 ORDER BY score DESC, h.timestamp DESC, {order} LIMIT ?
"""
# n(t), one scalar subquery per term with the term as a constant: the planner then estimates
# each from the GIN index's element statistics and counts its rows by a bitmap scan of that
# index (a term joined in from unnest() hid the value and got a sequential scan of the table).
_PG_COUNT = ("(?::text, {ord}, (SELECT COUNT(*) FROM {table} r WHERE r.term_array @> ARRAY[?::text])::float8)")
_PG_SUMMARY_HITS = ("SELECT e.id AS id, e.timestamp AS timestamp, e.term_array AS arr"
                    " FROM episodes e WHERE e.term_array && ?::text[] AND {cond}")
_PG_CHUNK_HITS = ("SELECT c.id AS cid, c.episode_id AS id, e.timestamp AS timestamp, c.term_array AS arr"
                  " FROM episode_chunks c JOIN episodes e ON e.id = c.episode_id"
                  " WHERE c.term_array && ?::text[] AND {cond}")


def pg_bm25_query(table: str, cond: str, params: list[Any], terms: list[str],
                  depth: int) -> tuple[str, list[Any]]:
    """PostgreSQL's BM25 ranking of ``table`` (SQL and parameters; ``_bm25_rows`` runs it)."""
    chunks = table == "episode_chunks"
    sql = _PG_BM25.format(
        table=table, counts=", ".join(_PG_COUNT.format(ord=i, table=table) for i in range(len(terms))),
        hits=(_PG_CHUNK_HITS if chunks else _PG_SUMMARY_HITS).format(cond=cond),
        cols="h.cid, h.id" if chunks else "h.id", order="h.id DESC, h.cid" if chunks else "h.id DESC")
    args: list[Any] = [v for t in terms for v in (t, t)]
    args += [BM25_IDF_FLOOR, list(terms), *params, BM25_K1, BM25_K1, BM25_B, BM25_B, depth]
    return sql, args


def _bm25_rows(conn: Any, table: str, cond: str, params: list[Any], terms: list[str],
               depth: int) -> list[Any]:
    """(id, cid, score) of the best ``depth`` rows of ``table`` for ``terms``, best first
    (cid: the chunk's id, None for summaries), filtered by ``cond`` (owner, visibility) in SQL —
    FTS5's bm25() on SQLite, the same BM25 in one indexed statement on PostgreSQL. Ties: newer
    episode first, then by id."""
    chunks = table == "episode_chunks"
    if dialect_of(conn) == "postgres":
        sql, args = pg_bm25_query(table, cond, params, terms, depth)
        rows = conn.execute(sql, args).fetchall()
        return [(r["id"], r["cid"] if chunks else None, float(r["score"])) for r in rows]
    match = _fts_query(terms)
    if chunks:
        rows = conn.execute(
            "SELECT c.id AS cid, c.episode_id AS id, bm25(episode_chunks_fts) AS rank"
            " FROM episode_chunks_fts JOIN episode_chunks c ON c.id = episode_chunks_fts.rowid"
            f" JOIN episodes e ON e.id = c.episode_id WHERE episode_chunks_fts MATCH ? AND {cond}"
            " ORDER BY rank, e.timestamp DESC, e.id DESC, c.id LIMIT ?", (match, *params, depth)).fetchall()
        return [(r["id"], r["cid"], -float(r["rank"])) for r in rows]
    rows = conn.execute(
        "SELECT e.id AS id, bm25(episodes_fts) AS rank FROM episodes_fts JOIN episodes e"
        f" ON e.id = episodes_fts.rowid WHERE episodes_fts MATCH ? AND {cond}"
        " ORDER BY rank, e.timestamp DESC, e.id DESC LIMIT ?", (match, *params, depth)).fetchall()
    return [(r["id"], None, -float(r["rank"])) for r in rows]


def _ranked(conn: Any, where: list[str], params: list[Any], terms: list[str], limit: int,
            method: str) -> list[tuple[Episode, int | None]]:
    """Run by Database.read: the best ``limit`` episodes for ``terms`` by ``method``, each with
    its best-matching chunk id (None when the turns did not take part)."""
    cond = " AND ".join(where)
    summary_rank: dict[int, int] = {}
    summary_score: dict[int, float] = {}
    if method in ("rrf", "bm25"):
        for i, (eid, _, score) in enumerate(_bm25_rows(conn, "episodes", cond, params, terms, RANK_DEPTH)):
            summary_rank[eid] = i
            summary_score[eid] = score
    turns_rank: dict[int, int] = {}
    turns_score: dict[int, float] = {}
    best_chunk: dict[int, int] = {}
    if method in ("rrf", "turns"):
        for eid, cid, score in _bm25_rows(conn, "episode_chunks", cond, params, terms, RANK_DEPTH * 4):
            if eid not in best_chunk:
                best_chunk[eid] = cid
                turns_rank[eid] = len(turns_rank)
                turns_score[eid] = score
    if method == "bm25":
        fused = summary_score
    elif method == "turns":
        fused = turns_score
    else:
        # Reciprocal-rank fusion: the ranks, not the scores, are combined (BM25 scores of the
        # short summary and of a chunk of turns are not on one scale).
        fused = {}
        for ranks in (summary_rank, turns_rank):
            for eid, rank in ranks.items():
                fused[eid] = fused.get(eid, 0.0) + 1.0 / (RRF_K + rank + 1)
    top = sorted(fused, key=lambda eid: -fused[eid])[:limit]
    if not top:
        return []
    rows = conn.execute(f"SELECT {_COLUMNS} FROM episodes WHERE id IN ({', '.join('?' * len(top))})",
                        top).fetchall()
    by_id = {r["id"]: r for r in rows}
    return [(_row(by_id[eid], score=fused[eid]), best_chunk.get(eid)) for eid in top if eid in by_id]


def _word_dfs(conn: Any, user_id: str, words: list[str]) -> dict[str, int]:
    """df(t) for recall's weights: how many of the user's episodes hold t in their summary or
    in one of their chunks (an exact term, as the FTS5 phrase "t" matches it)."""
    if dialect_of(conn) == "postgres":
        # one statement for every word, each a constant so the planner sees it; the user's own
        # episodes first (their index), then their chunks by episode id — not every user's
        # chunks holding a common word, as SQLite's FTS5 doclist gives them cheaply
        one = ("(SELECT COUNT(*) FROM episodes e WHERE e.user_id = ? AND (e.term_array @> ARRAY[?::text]"
               " OR EXISTS (SELECT 1 FROM episode_chunks c WHERE c.episode_id = e.id"
               "  AND c.term_array @> ARRAY[?::text]))) AS df{i}")
        row = conn.execute("SELECT " + ", ".join(one.format(i=i) for i in range(len(words))),
                           [v for w in words for v in (user_id, w, w)]).fetchone()
        return {w: int(row[i]) for i, w in enumerate(words)}
    out: dict[str, int] = {}
    for w in words:
        q = _fts_query([w])
        row = conn.execute(
            "SELECT COUNT(*) AS df FROM episodes e WHERE e.user_id = ? AND ("
            " e.id IN (SELECT rowid FROM episodes_fts WHERE episodes_fts MATCH ?) OR"
            " e.id IN (SELECT c.episode_id FROM episode_chunks c WHERE c.id IN"
            "  (SELECT rowid FROM episode_chunks_fts WHERE episode_chunks_fts MATCH ?)))",
            (user_id, q, q),
        ).fetchone()
        out[w] = int(row["df"])
    return out


def _tf_score(words: list[str], ep: Episode) -> float:
    """The spec's scoring: occurrences in the summary, plus a bonus per matching keyword."""
    hay = _prepare(ep.summary)
    keywords = {_prepare(k) for k in ep.keywords}
    score = 0.0
    for w in words:
        score += hay.count(w)
        if w in keywords:
            score += KEYWORD_WEIGHT
    return score
