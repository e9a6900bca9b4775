"""Recall: whether past episodes answer the current message, and which.

``EpisodeRecall`` (mixed into ``EpisodeStore``) holds ``recall`` — the gate on the weighted
coverage of the message's words, the "last time" cue, how many episodes — with the reads it
makes (``_recall_reads``) and the lone-word rule (``_lone_word_decides``); the semantic half is
``SemanticRecall`` (memory/episodes/semantic.py); what is shown of each episode is in
memory/episodes/evidence.py. Apart from the store because these are decisions tuned on the
labelled sets, not storage; it uses the store's ``db``, ``recent`` and ``_off_loop``.

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

import math
from typing import Any

from storage import Database
from memory.episodes.evidence import PARTIAL_CREDIT, RECALL_BUDGET_TOKENS, _fit, evidence_lines
from memory.episodes.keywords import _SELF_EN, MAX_QUERY_TERMS, _query_words, has_recall_cue
from memory.episodes.record import Episode, _where
from memory.episodes.search import _ranked, _word_dfs
from memory.episodes.semantic import SemanticRecall
from memory.scope import Scope
from memory.text.tokenizer import CJK as _CJK
from memory.text.tokenizer import is_common_zh, search_terms


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


_N_KEY = "\x00n"   # the user's episode count, carried with the word weights


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


class EpisodeRecall(SemanticRecall):
    """``recall`` and its bare-cue fallback; the host (``EpisodeStore``) gives ``db``, ``recent``
    and ``_off_loop``."""

    db: Database

    # -- recalling ------------------------------------------------------------------------
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

    async def _recent_for(self, scope: Scope, exclude_session: str | None, max_tokens: int) -> list[Episode]:
        return _fit(await self.recent(scope.user_id, RECALL_RECENT, scope=scope,
                                      exclude_session=exclude_session), max_tokens)
