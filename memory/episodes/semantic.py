"""Semantic recall (issue 31): the message's embedding against the user's episode vectors, fused
with the episodes the words chose.

``SemanticRecall`` is mixed into ``EpisodeStore`` (through ``EpisodeRecall``,
memory/episodes/recall.py): ``_query_vector`` (the message's vector, bounded and backed off
after a failure), ``_semantic`` (the episode that stands out by meaning, if one does) and
``_with_semantic`` (RRF of both choices, each with its evidence). Apart from the word-based
decisions because it runs only with an embedding model configured and has its own failure
mode (``recall.embedding_unavailable``); it uses the host's ``db``, ``embedder``,
``query_timeout``, ``turns`` and ``_off_loop``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from storage import Database
from memory.episodes.embedding import Embedder, EmbeddingError
from memory.episodes.evidence import EVIDENCE_NEIGHBOURS, _fit, evidence_lines
from memory.episodes.keywords import _speaks_of_self
from memory.episodes.record import _COLUMNS, Episode, _row
from memory.episodes.search import RRF_K
from memory.episodes.vectors import SUMMARY_SEQ, nearest

log = logging.getLogger(__name__)


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


class SemanticRecall:
    """Recall's semantic half; the host (``EpisodeStore``) sets the attributes below."""

    db: Database
    embedder: Embedder | None
    query_timeout: float
    _embed_down_until: float
    _embed_down: bool

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
