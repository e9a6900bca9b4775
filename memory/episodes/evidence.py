"""What recall injects: the evidence lines of a recalled episode and fitting them to a budget.

``evidence_lines`` picks the lines of a session that answer the message (with their
neighbours), ``episode_lines`` renders an episode as it reads in ``<related_episodes>``, and
``_fit`` cuts the recalled episodes to ``RECALL_BUDGET_TOKENS`` (headings to ``HEADING_TOKENS``,
evidence to ``EVIDENCE_TOKENS`` per episode) with ``_trim_to_tokens``. Apart from recall's
decisions (which episodes) because this is about how much of each is shown, and the prompt
(bot/agent/prompt.py) renders with it.
"""

from __future__ import annotations

import re

from memory.episodes.chunks import CHUNK_LINES, CHUNK_STRIDE, session_lines
from memory.episodes.record import Episode
from memory.text.tokenizer import index_terms
from memory.text.tokens import estimate_tokens


# What recall injects (docs/memory.md "What recall injects"): per message at most
# RECALL_BUDGET_TOKENS for the whole <related_episodes> block, as rendered by episode_lines;
# each episode a heading (date, summary ≤ HEADING_TOKENS, keywords) and its evidence — the user
# lines that matched the message with EVIDENCE_NEIGHBOURS lines either side, at most
# EVIDENCE_WINDOWS places in the session, ≤ EVIDENCE_TOKENS per episode.
RECALL_BUDGET_TOKENS = 900
HEADING_TOKENS = 100
EVIDENCE_TOKENS = 300
EVIDENCE_NEIGHBOURS = 1
EVIDENCE_WINDOWS = 2
EVIDENCE_CHUNKS = 3        # the best-matching chunks whose lines are scored one by one
EXCERPT_TOKENS = EVIDENCE_TOKENS   # (older name)
PARTIAL_CREDIT = 0.5       # a message word met only through its sub-words (数据库 → 数据)
MIN_TRIMMED_TOKENS = 40    # below this, a second episode is left out rather than cut


def _trim_to_tokens(text: str, budget: int) -> str:
    if estimate_tokens(text) <= budget:
        return text
    used = 0.0
    for i, ch in enumerate(text):
        used += 0.25 if ch.isascii() else 1.0   # as estimate_tokens counts
        if used > budget - 1:
            return text[:i].rstrip() + "…"
    return text


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
