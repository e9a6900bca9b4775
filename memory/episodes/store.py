"""Layer 4: episodic memory — one keyworded summary per finished session, per user.

When a session ends with at least two user turns, ``EpisodeStore.write`` keeps one
*episode* per participating user: the spec's record (session_id, summary, timestamp,
model, turn_count, keywords) plus its scope (user_id, chat_id, chat_type, visibility —
an episode of a p2p chat is ``private``). Writing is idempotent per (user, session):
a resumed session that ends again updates its episode.

Words
-----
The words come from the shared tokeniser (memory/text/tokenizer.py: jieba for Chinese, stop words
dropped, English lightly stemmed). ``extract_keywords(text, k=8)`` — at most ``k`` (≤ 8)
distinct words ranked by term frequency, ties broken by first appearance; ``search_terms`` /
``index_terms`` (the tokeniser's) are what the index stores and a search looks up.

Index (schema v4)
-----------------
``episodes.terms``: the summary's and keywords' search terms *with their repeats* (term
frequency kept), under FTS5 ``episodes_fts``. ``episode_chunks``: what the users said in the
session, ``CHUNK_LINES`` lines per chunk overlapping by one, each with its terms under
``episode_chunks_fts``. Only user lines (an assistant answer restates memory injected from
other sessions). ``started_at`` / ``ended_at``: the session's first and last message.
PostgreSQL: GIN indexes over ``term_array`` (``terms`` split, a stored column) of both tables, and
``episode_index_stats`` (schema v9) for BM25's row count and term total; ``_bm25_rows``
computes FTS5's bm25() there, so both engines give the same rankings (docs/memory.md).

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

Recall
------
``recall(scope, text)``: candidates are the RRF top ``RECALL_CANDIDATES``; each is judged by
the *weighted coverage* of the message's words by its summary plus its best chunk::

    coverage = Σ w(t) for message terms t found  /  Σ w(t) for all message terms
    w(t) = log(1 + N / (1 + df(t)))   over the user's own N episodes (summary or turns)

(a word met only through a sub-word earns ``PARTIAL_CREDIT``). Recalled when coverage ≥
``RECALL_THRESHOLD`` (one matching word) or ≥ ``RECALL_THRESHOLD_MULTI`` (two or more), and
one matched word is distinctive (in at most a third of the user's episodes, from
``DISTINCT_MIN_EPISODES`` on). A "last time" cue (``RECALL_CUES``) lowers the bar to
``RECALL_CUE_THRESHOLD``; a bare cue with no content word gets the ``RECALL_RECENT`` newest
episodes. How many: those within ``RECALL_RELATIVE`` of the best, at most ``k``, within
``max_tokens`` (``RECALL_BUDGET_TOKENS``): each its summary as heading and its evidence — the
lines that hold the message's words, with neighbours (``evidence_lines``, ``episode_lines``). Private (p2p) episodes
are recalled only in p2p; a group's only in that group; another user's never. One matched
word alone decides only when ``_lone_word_decides`` (specific in the language, and an English
message speaks of the user). Tuned on the generated sets: recall 0.922 (suite set) / 0.934
(larger set) of questions get their evidence episode, 0 of 44 / 0 of 132 unrelated messages
get any (see docs/memory.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from storage import Database, dialect_of
from memory.episodes.embedding import Embedder, EmbeddingError
from memory.episodes.reltime import day_of, resolve
from memory.scope import PRIVATE_CHAT_TYPES, Scope
from memory.episodes.chunks import CHUNK_LINES, CHUNK_STRIDE, session_lines
from memory.text.tokenizer import CJK as _CJK
from memory.text.tokenizer import index_terms, is_common_zh, is_warm, search_terms
from memory.text.tokenizer import prepare as _prepare, stem as _stem, words as _words
from memory.episodes.vectors import SUMMARY_SEQ, nearest

log = logging.getLogger(__name__)

MIN_TURNS = 2              # a session with fewer user turns leaves no episode
MAX_KEYWORDS = 8
MAX_SUMMARY_CHARS = 4000
MAX_QUERY_TERMS = 32
KEYWORD_WEIGHT = 2         # tf method: a query word that is an episode keyword counts this much more
METHODS = ("rrf", "bm25", "turns", "tf")
DEFAULT_METHOD = "rrf"
MAX_IMPORT_SUMMARY_CHARS = 100_000   # an import accepts long text (cut to MAX_SUMMARY_CHARS, not refused)
MAX_BODY_LINES = 400       # turns indexed per session (the newest kept beyond this)
MAX_BODY_LINE_CHARS = 1000
RRF_K = 60                 # reciprocal-rank fusion constant (Cormack et al.)
RANK_DEPTH = 50            # how deep each ranking (summary, turns) is read before fusion

# Recall gate (tuned on tests/memory/episodes_labelled.py; see the module docstring).
RECALL_THRESHOLD = 0.4     # weighted coverage needed when one word of the message matches
RECALL_THRESHOLD_MULTI = 0.25  # ... when RECALL_MIN_TERMS or more distinct words match
RECALL_MIN_TERMS = 2
RECALL_CANDIDATES = 10
RECALL_MAX = 3             # at most this many episodes injected ...
RECALL_RELATIVE = 0.7      # ... each with coverage >= this share of the best one's
RECALL_CUE_THRESHOLD = 0.15  # with a "last time" cue, a weaker match is enough
DISTINCT_MIN_EPISODES = 4  # the distinctive-word rule applies from this many episodes on
RECALL_RECENT = 2          # a bare "do you remember what we talked about" gets the newest ones
# What recall injects (docs/memory.md "What recall injects"): per message at most
# RECALL_BUDGET_TOKENS for the whole <related_episodes> block, as rendered by episode_lines;
# each episode a heading (date, summary ≤ HEADING_TOKENS, keywords) and its evidence — the user
# lines that matched the message with EVIDENCE_NEIGHBOURS lines either side, at most
# EVIDENCE_WINDOWS places in the session, ≤ EVIDENCE_TOKENS per episode.
RECALL_BUDGET_TOKENS = 900
# Semantic recall (issue 31; memory/episodes/vectors.py, docs/memory.md "Embeddings"), with an embedding
# model configured: the message's vector against the user's episode vectors (summary and each
# line). The best episode (by its best vector) joins the episodes the words chose when it stands
# out: SEMANTIC_GAP above the next episode and SEMANTIC_LIFT above the median of the others (the
# message is about *that* session, not like every session), the user has SEMANTIC_MIN_EPISODES
# episodes to compare, and the message speaks of the user (I / my / 我 …: "how far is the moon"
# is like every session a little). The two rankings are fused by RRF; its evidence is the
# best-matching line with its neighbours. Tuned with multilingual-e5-small on the generated set
# (bench/bench_recall.py; docs/memory.md): relative, so no model's absolute scale is assumed.
SEMANTIC_DEPTH = 400       # nearest vectors read (a user's lines and summaries)
SEMANTIC_GAP = 0.02
SEMANTIC_LIFT = 0.03
SEMANTIC_MIN_EPISODES = 3
QUERY_EMBED_TIMEOUT_S = 2.0  # the message's own embedding is on the reply path: bounded
EMBED_RETRY_S = 30.0       # after a failure the endpoint is not asked again for this long
HEADING_TOKENS = 100
EVIDENCE_TOKENS = 300
EVIDENCE_NEIGHBOURS = 1
EVIDENCE_WINDOWS = 2
EVIDENCE_CHUNKS = 3        # the best-matching chunks whose lines are scored one by one
EXCERPT_TOKENS = EVIDENCE_TOKENS   # (older name)
PARTIAL_CREDIT = 0.5       # a message word met only through its sub-words (数据库 → 数据)
MIN_TRIMMED_TOKENS = 40    # below this, a second episode is left out rather than cut


def extract_keywords(text: str, k: int = MAX_KEYWORDS) -> list[str]:
    """At most ``k`` (≤ 8) keywords of ``text`` by term frequency, then first appearance."""
    k = max(0, min(int(k), MAX_KEYWORDS))
    words = _words(text)
    if not words or k == 0:
        return []
    counts = Counter(words)
    first: dict[str, int] = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    ranked = sorted(counts, key=lambda w: (-counts[w], first[w]))
    return ranked[:k]


def _query_words(text: str) -> list[tuple[str, set[str]]]:
    """The message's words (accurate mode, stemmed) each with its search-mode sub-words."""
    out: dict[str, set[str]] = {}
    for w in _words(text)[:MAX_QUERY_TERMS]:
        stem = _stem(w)
        if stem not in out:
            out[stem] = set(search_terms(w)) - {stem}
    return list(out.items())


# A message asking about the past in general ("还记得我们之前聊过的内容吗", "what did we talk
# about last time?"): recall falls back to the newest episodes when no content word decides.
RECALL_CUES = re.compile(
    r"(上次|上回|之前|以前|那次|还记得|记得吗|记不记得|聊过|说过|讨论过|提到过|提过|谈过|"
    r"last time|previously|earlier|remember|we talked|we discussed|talked about|you said|we spoke)",
    re.IGNORECASE,
)


def has_recall_cue(text: str) -> bool:
    return bool(RECALL_CUES.search(text or ""))


# English marks whom a question is about; a question about the user's own past says so.
_SELF_EN = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|our|ours|us)\b",
                      re.IGNORECASE)


_SELF_ZH = re.compile(r"[我咱俺]")


def _speaks_of_self(text: str) -> bool:
    """The message speaks of the user (semantic recall's condition; see SEMANTIC_GAP)."""
    return bool(_SELF_EN.search(text) or _SELF_ZH.search(text))


def _lone_word_decides(word: str, text: str, cue: bool) -> bool:
    """Whether one matched word (the message's other words absent from the episode) is evidence
    enough. Measured on the generated set (bench/bench_recall.py), the unrelated messages that got
    an episode all rested on one word that says nothing about the user's past: a word among the
    commonest of the language (我投的是哪家公司？ → 公司, said in passing in a session about moving),
    or a name in a general-knowledge question (What's the capital of Australia? → the visa session).
    So the word must be specific in the language (jieba's dictionary count; the user's own
    episodes are too few to tell 公司 is common), and an English message must speak of the user
    (I / my / we …) — Chinese drops the pronoun (下一轮面试是什么时候), so it is not asked there.
    A "last time" cue says the message is about a past conversation: the word then suffices."""
    if cue:
        return True
    if is_common_zh(word):
        return False
    return bool(_CJK.search(text)) or bool(_SELF_EN.search(text))


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


def estimate_tokens(text: str) -> int:
    """A CJK character is about one token; other text about four characters a token."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def _trim_to_tokens(text: str, budget: int) -> str:
    if estimate_tokens(text) <= budget:
        return text
    used = 0.0
    for i, ch in enumerate(text):
        used += 1.0 if _CJK.match(ch) else 0.25
        if used > budget - 1:
            return text[:i].rstrip() + "…"
    return text


# --- records ----------------------------------------------------------------------------


@dataclass(slots=True)
class Episode:
    id: int
    user_id: str
    session_id: str
    chat_id: str
    chat_type: str
    visibility: str
    summary: str
    keywords: list[str]
    model: str
    turn_count: int
    timestamp: float
    started_at: float | None = None
    ended_at: float | None = None
    score: float = 0.0
    matched: list[str] = field(default_factory=list)
    excerpt: str = ""          # recall: the evidence lines joined (older callers read this)
    evidence: list[str] = field(default_factory=list)   # recall: the matching lines with neighbours

    def to_dict(self) -> dict[str, Any]:
        """The spec's record (episodes.json), plus scope and the session's dates."""
        return {
            "session_id": self.session_id,
            "summary": self.summary,
            "timestamp": self.timestamp,
            "model": self.model,
            "turn_count": self.turn_count,
            "keywords": list(self.keywords),
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "visibility": self.visibility,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @property
    def date(self) -> str:
        """The session's day (UTC, YYYY-MM-DD), or its last day when it spans several."""
        ts = self.ended_at or self.started_at or self.timestamp
        return time.strftime("%Y-%m-%d", time.gmtime(ts)) if ts else ""


_COLUMNS = ("id, user_id, session_id, chat_id, chat_type, visibility, summary, keywords, model, turn_count,"
            " timestamp, started_at, ended_at")
_E_COLUMNS = ", ".join("e." + c.strip() for c in _COLUMNS.split(","))


def _row(row: Any, *, score: float = 0.0) -> Episode:
    try:
        keywords = json.loads(row["keywords"] or "[]")
        if not isinstance(keywords, list):
            keywords = []
    except ValueError:
        keywords = []
    return Episode(
        id=row["id"], user_id=row["user_id"], session_id=row["session_id"], chat_id=row["chat_id"],
        chat_type=row["chat_type"], visibility=row["visibility"], summary=row["summary"],
        keywords=[str(k) for k in keywords], model=row["model"], turn_count=row["turn_count"],
        timestamp=row["timestamp"], started_at=row["started_at"], ended_at=row["ended_at"], score=score,
    )


def _where(user_id: str, scope: Scope | None, exclude_session: str | None) -> tuple[list[str], list[Any]]:
    """The owner filter (always), where ``scope`` may see the episode, and the excluded session.

    DESIGN.md §4: an episode of a group session belongs to that group — it holds other
    members' words — so it is seen only in that group (``chat_id``), never in a p2p chat or
    another group; a p2p episode only in p2p. (Facts and profile keep the looser
    ``visible_sql`` rule: they are the user's own words.)"""
    where = ["e.user_id = ?"]
    params: list[Any] = [user_id]
    if scope is not None:
        sql, extra = episode_visibility(scope, "e.")
        where.append(sql)
        params.extend(extra)
    if exclude_session:
        where.append("e.session_id <> ?")
        params.append(exclude_session)
    return where, params


def episode_visibility(scope: Scope, prefix: str = "") -> tuple[str, list[Any]]:
    if scope.is_private:
        return f"{prefix}visibility = 'private'", []
    return f"({prefix}visibility = 'shared' AND {prefix}chat_id = ?)", [scope.chat_id]


_N_KEY = "\x00n"   # the user's episode count, carried with the word weights


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


def _recall_reads(conn: Any, where: list[str], params: list[Any], terms: list[str], user_id: str,
                  words: list[str]) -> tuple[list[Episode], dict[str, float], dict[int, list[tuple[str, set[str], set[str]]]]]:
    """Run by Database.read: the fused candidates; when there are any, the word weights
    w(t) = log(1 + N / (1 + df(t))) over the user's own N episodes (df: episodes whose summary
    or turns hold t), and each candidate's evidence: its summary's terms and each chunk's."""
    ranked = _ranked(conn, where, params, terms, RECALL_CANDIDATES, "rrf")
    candidates = [ep for ep, _ in ranked]
    if not candidates:
        return [], {}, {}
    n = int(conn.execute("SELECT COUNT(*) AS n FROM episodes WHERE user_id = ?", (user_id,)).fetchone()["n"])
    dfs = _word_dfs(conn, user_id, words)
    weights: dict[str, float] = {w: math.log(1 + n / (1 + dfs.get(w, 0))) for w in words}
    weights[_N_KEY] = float(n)
    ids = [ep.id for ep in candidates]
    marks = ", ".join("?" * len(ids))
    evidence: dict[int, list[tuple[str, set[str], set[str]]]] = {i: [] for i in ids}
    summary_terms = {r["id"]: set(r["terms"].split()) for r in conn.execute(
        f"SELECT id, terms FROM episodes WHERE id IN ({marks})", ids).fetchall()}
    chunks: dict[int, list[tuple[str, set[str]]]] = {i: [] for i in ids}
    for r in conn.execute(f"SELECT episode_id, text, terms FROM episode_chunks WHERE episode_id IN ({marks})"
                          " ORDER BY episode_id, seq", ids).fetchall():
        chunks[r["episode_id"]].append((r["text"], set(r["terms"].split())))
    for i in ids:
        base = summary_terms.get(i, set())
        evidence[i].append(("", base, set()))
        # a chunk is judged with the summary beside it: the summary says what the session was
        # about, the chunk what was said there (its own terms kept to pick the evidence lines)
        evidence[i].extend((text, base | t, t) for text, t in chunks[i])
    return candidates, weights, evidence


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


class EpisodeStore:
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

    async def recall(
        self, scope: Scope, text: str, *, k: int = RECALL_MAX, max_tokens: int = RECALL_BUDGET_TOKENS,
        exclude_session: str | None = None,
    ) -> list[Episode]:
        """Past episodes the current message is about (for ``<related_episodes>``), or ``[]``.

        Only ``scope.user_id``'s episodes that this chat may see. Decided on evidence from the
        index (see the module docstring): weighted coverage of the message's words by the
        summary plus the best chunk of turns; a bare "last time" cue gets the newest episodes.
        How many: those within ``RECALL_RELATIVE`` of the best, at most ``k``, within ``max_tokens``.
        """
        if k <= 0 or max_tokens <= 0:
            return []
        where, params = _where(scope.user_id, scope, exclude_session)
        # Most messages come from users with nothing to recall here (new, or no episode this
        # chat may see): one indexed read instead of segmenting the text twice with jieba
        # (~0.5 ms of event loop per message, measured in bench_throughput).
        if await self.db.fetchone(f"SELECT 1 FROM episodes e WHERE {' AND '.join(where)} LIMIT 1",
                                  params) is None:
            return []
        cue = has_recall_cue(text)
        semantic = await self._semantic(where, params, text, k) if self.embedder is not None else {}
        words = await self._off_loop(_query_words, text)
        terms = (await self._off_loop(search_terms, text))[:MAX_QUERY_TERMS] if words else []
        if not terms:
            if semantic:
                return await self._with_semantic([], semantic, words, {}, {}, k, max_tokens)
            return await self._recent_for(scope, exclude_session, max_tokens) if cue else []
        candidates, weights, evidence = await self.db.read(
            _recall_reads, where, params, terms, scope.user_id, [w for w, _ in words])
        if not candidates:
            if semantic:
                return await self._with_semantic([], semantic, words, weights, evidence, k, max_tokens)
            return await self._recent_for(scope, exclude_session, max_tokens) if cue else []
        n_eps = max(weights.pop(_N_KEY, 1.0), 1.0)
        total = sum(weights.values()) or 1.0
        distinctive = math.log(1 + n_eps / (1 + max(1.0, n_eps / 3)))
        judged: list[tuple[float, Episode]] = []
        for ep in candidates:
            best = (0.0, [], "")
            for chunk_text, ep_terms, _ in evidence.get(ep.id, []):
                matched: list[str] = []
                credit = 0.0
                for word, variants in words:
                    if word in ep_terms:
                        credit += weights[word]
                    elif variants & ep_terms:
                        credit += PARTIAL_CREDIT * weights[word]
                    else:
                        continue
                    matched.append(word)
                if credit > best[0]:
                    best = (credit, matched, chunk_text)
            coverage = best[0] / total
            matched = best[1]
            # at least one matched word must be distinctive — in at most a third of the user's
            # episodes — or small talk shared by many sessions ("手机", "加班") would recall them
            # (with fewer than DISTINCT_MIN_EPISODES episodes, every word is in "many" of them)
            if n_eps >= DISTINCT_MIN_EPISODES and not any(weights[w] >= distinctive for w in matched):
                continue
            needed = RECALL_THRESHOLD_MULTI if len(matched) >= RECALL_MIN_TERMS else RECALL_THRESHOLD
            if cue:
                needed = min(needed, RECALL_CUE_THRESHOLD)
            if len(matched) == 1 and not _lone_word_decides(matched[0], text, cue):
                continue
            if matched and coverage >= needed:
                ep.matched = matched
                ep.excerpt = best[2]
                judged.append((coverage, ep))
        if not judged:
            if semantic:
                return await self._with_semantic([], semantic, words, weights, evidence, k, max_tokens)
            return []
        judged.sort(key=lambda j: (-j[0], -j[1].score, -j[1].timestamp))
        top = judged[0][0]
        chosen = [ep for cov, ep in judged[:k] if cov >= RECALL_RELATIVE * top]
        # a message asking about two things (two-hop: "…的城市？另外，…的月租") is covered half by
        # each of two sessions: one that passed the gate on words the chosen ones lack comes too
        covered = {w for ep in chosen for w in ep.matched}
        for cov, ep in judged:
            if len(chosen) >= k:
                break
            if ep not in chosen and set(ep.matched) - covered:
                chosen.append(ep)
                covered |= set(ep.matched)
        for ep in chosen:
            ep.score = next(cov for cov, e in judged if e is ep)
        if semantic:
            return await self._with_semantic(chosen, semantic, words, weights, evidence, k, max_tokens)
        for ep in chosen:
            chunks = [(text, own) for text, _, own in evidence.get(ep.id, []) if text]
            ep.evidence = await self._off_loop(evidence_lines, words, weights, chunks)
        return _fit(chosen, max_tokens)

    # -- semantic recall (issue 31) ---------------------------------------------------------
    async def _query_vector(self, text: str) -> list[float] | None:
        """The message's vector, or None (no model, or it failed: BM25 alone answers). A failure
        is logged once (``recall.embedding_unavailable``) and the endpoint left alone for
        ``EMBED_RETRY_S``, so an outage costs neither a timeout per message nor a log line each."""
        assert self.embedder is not None
        if time.monotonic() < self._embed_down_until:
            return None
        try:
            vecs = await asyncio.wait_for(self.embedder.embed([text], query=True), self.query_timeout)
            if len(vecs) != 1:
                raise EmbeddingError(f"1 text gave {len(vecs)} vectors")
        except (EmbeddingError, asyncio.TimeoutError, OSError) as e:
            self._embed_down_until = time.monotonic() + EMBED_RETRY_S
            if not self._embed_down:
                self._embed_down = True
                log.warning("recall.embedding_unavailable", extra={
                    "model": self.embedder.model, "error": type(e).__name__ + (f": {e}" if str(e) else ""),
                    "fallback": "bm25"})
            return None
        if self._embed_down:
            self._embed_down = False
            log.info("recall.embedding_restored", extra={"model": self.embedder.model})
        return vecs[0]

    async def _semantic(self, where: list[str], params: list[Any], text: str,
                        k: int) -> dict[int, tuple[float, int]]:
        """Episodes the message is about by meaning: episode id → (similarity, best line's seq,
        SUMMARY_SEQ when only the summary matched), at most ``k``; {} without vectors."""
        assert self.embedder is not None
        if not (text or "").strip():
            return {}
        qv = await self._query_vector(text)
        if qv is None:
            return {}
        rows = await self.db.read(nearest, where, params, self.embedder.model, qv, SEMANTIC_DEPTH)
        best: dict[int, float] = {}
        line: dict[int, tuple[float, int]] = {}
        for eid, seq, sim in rows:
            if eid not in best:
                best[eid] = sim
            if seq != SUMMARY_SEQ and eid not in line:
                line[eid] = (sim, seq)
        if not best:
            return {}
        ranked = sorted(best.items(), key=lambda x: -x[1])
        if len(ranked) < SEMANTIC_MIN_EPISODES or not _speaks_of_self(text):
            return {}
        (eid, top), second = ranked[0], ranked[1][1]
        others = sorted(s for _, s in ranked[1:])
        if top - second < SEMANTIC_GAP or top - others[len(others) // 2] < SEMANTIC_LIFT:
            return {}
        return {eid: (top, line.get(eid, (top, SUMMARY_SEQ))[1])}

    async def _with_semantic(self, chosen: list[Episode], semantic: dict[int, tuple[float, int]],
                             words: list, weights: dict[str, float], evidence: dict, k: int,
                             max_tokens: int) -> list[Episode]:
        """The episodes the words chose and those the vectors chose, fused by RRF (k = RRF_K);
        each with its evidence: the lines holding the message's words, else the line the
        vectors matched with its neighbours."""
        fused: dict[int, float] = {}
        for rank, ep in enumerate(chosen):
            fused[ep.id] = 1.0 / (RRF_K + rank + 1)
        for rank, eid in enumerate(semantic):
            fused[eid] = fused.get(eid, 0.0) + 1.0 / (RRF_K + rank + 1)
        by_id = {ep.id: ep for ep in chosen}
        missing = [eid for eid in semantic if eid not in by_id]
        if missing:
            rows = await self.db.fetchall(
                f"SELECT {_COLUMNS} FROM episodes WHERE id IN ({', '.join('?' * len(missing))})", missing)
            for r in rows:
                by_id[r["id"]] = _row(r, score=semantic[r["id"]][0])
        order = sorted((eid for eid in fused if eid in by_id), key=lambda eid: -fused[eid])[:k]
        out: list[Episode] = []
        for eid in order:
            ep = by_id[eid]
            chunks = [(text, own) for text, _, own in evidence.get(eid, []) if text]
            ep.evidence = await self._off_loop(evidence_lines, words, weights, chunks) if chunks and words else []
            if not ep.evidence and eid in semantic and semantic[eid][1] != SUMMARY_SEQ:
                lines = await self.turns(eid)
                at = semantic[eid][1]
                lo, hi = max(0, at - EVIDENCE_NEIGHBOURS), min(len(lines), at + EVIDENCE_NEIGHBOURS + 1)
                ep.evidence = lines[lo:hi]
            if eid in semantic and not ep.matched:
                ep.matched = ["~semantic"]
            out.append(ep)
        return _fit(out, max_tokens)

    async def _recent_for(self, scope: Scope, exclude_session: str | None, max_tokens: int) -> list[Episode]:
        return _fit(await self.recent(scope.user_id, RECALL_RECENT, scope=scope,
                                      exclude_session=exclude_session), max_tokens)

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


def _credit(words: list[tuple[str, set[str]]], weights: dict[str, float], terms: set[str]) -> tuple[float, frozenset]:
    credit, hit = 0.0, []
    for word, variants in words:
        if word in terms:
            credit += weights.get(word, 1.0)
        elif variants & terms:
            credit += PARTIAL_CREDIT * weights.get(word, 1.0)
        else:
            continue
        hit.append(word)
    return credit, frozenset(hit)


def evidence_lines(words: list[tuple[str, set[str]]], weights: dict[str, float],
                   chunks: list[tuple[str, set[str]]]) -> list[str]:
    """The lines of a session that answer the message, with their neighbours, in order.

    The ``EVIDENCE_CHUNKS`` chunks whose own terms (not the summary's) best cover the message
    are split into lines and each line scored by the weighted message words it holds; the best
    line, and a second one holding a message word the first window lacks, each bring
    ``EVIDENCE_NEIGHBOURS`` lines either side (the exchange around it). Windows are separated
    by "…". ``[]`` when no line holds a message word (the summary alone matched)."""
    if not chunks:
        return []
    ranked = sorted(((c, seq) for seq, (_, terms) in enumerate(chunks)
                     for c in [_credit(words, weights, terms)[0]] if c > 0), key=lambda x: (-x[0], x[1]))
    if not ranked:
        return []
    lines = session_lines([t for t, _ in chunks])
    candidates: set[int] = set()
    for _, seq in ranked[:EVIDENCE_CHUNKS]:
        start = seq * CHUNK_STRIDE
        candidates.update(range(start, min(start + CHUNK_LINES, len(lines))))
    scored = []
    for i in sorted(candidates):
        credit, hit = _credit(words, weights, set(index_terms(lines[i])))
        if credit > 0:
            scored.append((credit, i, hit))
    if not scored:
        return []
    scored.sort(key=lambda x: (-x[0], x[1]))
    windows: list[tuple[int, int]] = []
    covered: set[str] = set()
    for credit, i, hit in scored:
        if len(windows) >= EVIDENCE_WINDOWS:
            break
        lo, hi = max(0, i - EVIDENCE_NEIGHBOURS), min(len(lines) - 1, i + EVIDENCE_NEIGHBOURS)
        if any(a <= i <= b for a, b in windows) or (windows and hit <= covered):
            continue
        windows.append((lo, hi))
        covered |= hit
    windows.sort()
    out: list[str] = []
    last = -2
    for lo, hi in windows:
        lo = max(lo, last + 1)
        if out and lo > last + 1:
            out.append("…")
        out.extend(lines[lo:hi + 1])
        last = max(last, hi)
    return out


def _speaker_line(line: str) -> str:
    """``[Name] text`` (a group member) → ``Name: text``; a p2p line is the user's."""
    m = re.match(r"^\[([^\]\n]{1,64})\]\s?(.*)$", line, re.DOTALL)
    return f"{m.group(1)}: {m.group(2)}" if m else f"user: {line}"


def episode_lines(ep: Episode) -> list[str]:
    """How one recalled episode reads in ``<related_episodes>`` (unescaped): its heading — the
    session's date, summary and keywords — then each evidence line with the date and speaker."""
    date = getattr(ep, "date", "")
    kw = ", ".join(getattr(ep, "keywords", ()) or ())
    out = [(f"- [{date}] " if date else "- ") + ep.summary + (f" (keywords: {kw})" if kw else "")]
    evidence = getattr(ep, "evidence", None)
    if evidence is None:                # a record from before evidence lines: its excerpt
        evidence = [l for l in (getattr(ep, "excerpt", "") or "").split("\n") if l]
    for line in evidence:
        out.append("  …" if line == "…" else (f"  [{date}] " if date else "  ") + _speaker_line(line))
    return out


def _fit(episodes: list[Episode], max_tokens: int) -> list[Episode]:
    """Episodes best first, as ``episode_lines`` renders them, within ``max_tokens`` in all:
    headings cut to ``HEADING_TOKENS``, evidence to ``EVIDENCE_TOKENS`` per episode; a line
    already shown for an earlier episode is not repeated, nor an episode whose summary and
    evidence are both already shown."""
    out: list[Episode] = []
    budget = max_tokens
    seen_lines: set[str] = set()
    seen_summaries: set[str] = set()
    for ep in episodes:
        ep.summary = _trim_to_tokens(ep.summary, HEADING_TOKENS)
        lines = [l for l in ep.evidence if l == "…" or " ".join(l.split()) not in seen_lines]
        while lines and lines[0] == "…":
            lines.pop(0)
        ep.evidence = []
        head = estimate_tokens(episode_lines(ep)[0]) + 1
        if not lines and ep.summary in seen_summaries:
            continue
        if head > budget:
            if out:
                break
            ep.summary = _trim_to_tokens(ep.summary, max(1, budget - 20))
            head = estimate_tokens(episode_lines(ep)[0]) + 1
        room = min(EVIDENCE_TOKENS, budget - head)
        kept: list[str] = []
        for line in lines:
            ep.evidence = [line]
            cost = estimate_tokens(episode_lines(ep)[1]) + 1
            if cost > room:
                if room >= MIN_TRIMMED_TOKENS and line != "…":
                    prefix = estimate_tokens(episode_lines(ep)[1]) - estimate_tokens(line)
                    kept.append(_trim_to_tokens(line, room - prefix - 1))
                    room = 0
                break
            kept.append(line)
            room -= cost
        while kept and kept[-1] == "…":
            kept.pop()
        ep.evidence = kept
        ep.excerpt = "\n".join(kept)
        cost = sum(estimate_tokens(l) + 1 for l in episode_lines(ep))
        out.append(ep)
        budget -= cost
        seen_summaries.add(ep.summary)
        seen_lines.update(" ".join(l.split()) for l in kept)
        if budget <= MIN_TRIMMED_TOKENS:
            break
    return out


def _clean_keywords(keywords: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for kw in keywords:
        kw = " ".join(str(kw).split())[:40]
        if kw and kw not in out:
            out.append(kw)
        if len(out) >= MAX_KEYWORDS:
            break
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
