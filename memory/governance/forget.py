"""Forgetting one fact everywhere it is remembered (issue 31).

``/forget <id>`` and the console's delete remove the fact — and the same statement wherever
else memory keeps it, or the next answer would still say it from another layer:

* the fact's row (its superseded history is left as ``FactStore.delete`` leaves it);
* the user's **episodes**: the lines of what was said that state it are taken out of the
  indexed turns (the chunks rebuilt from the rest, so search, recall and its evidence can no
  longer find them), and the sentences of the summary that state it are dropped (keywords and
  search terms re-derived; a summary left empty becomes an extractive one of the remaining
  lines, and an episode with nothing left is deleted);
* the **working-memory summaries** (warm summaries, rolling summary) of the sessions the user
  spoke in: the sentences that state it;
* the user's **profile entries** that state it.

"States it" (``Needle.found_in``): a line or sentence holding the fact's content words — all of
them when it has at most two, else at least two thirds — and every number of three or more
digits the fact holds (a phone number, a year, an amount). Decided on words, not on the whole
string: the fact is the model's restatement ("用户在杭州工作") of what the user said ("我在杭州
工作三年了"). Chat history (layer 1, the messages) stays, as with ``/forget all``; a session
still open replays its recent turns verbatim until it ends.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from storage import Database, serialize_tx
from memory.episodes.chunks import session_lines
from memory.episodes.keywords import extract_keywords
from memory.episodes.store import prepare_chunks, summary_terms, write_chunks
from memory.text.tokenizer import search_terms

_NUMBER = re.compile(r"\d{3,}")
# sentence ends, Chinese and English (the separator is kept with the sentence before it)
_SENTENCES = re.compile(r"[^。！？!?；;\n]+[。！？!?；;]?|\n")


@dataclass(frozen=True)
class Needle:
    """What marks a line or sentence as stating the forgotten fact."""
    terms: frozenset[str]
    numbers: frozenset[str]

    @classmethod
    def of(cls, text: str) -> "Needle":
        return cls(frozenset(search_terms(text)), frozenset(_NUMBER.findall(text)))

    @property
    def empty(self) -> bool:
        return not self.terms and not self.numbers

    def found_in(self, text: str) -> bool:
        if self.empty or not text.strip():
            return False
        if any(n not in text for n in self.numbers):
            return False
        if not self.terms:
            return True
        have = len(self.terms & set(search_terms(text)))
        need = len(self.terms) if len(self.terms) <= 2 else math.ceil(len(self.terms) * 2 / 3)
        return have >= need


def without(text: str, needle: Needle) -> str:
    """``text`` without the sentences that state the fact (unchanged when none does)."""
    parts = _SENTENCES.findall(text or "")
    kept = [p for p in parts if p == "\n" or not needle.found_in(p)]
    if len(kept) == len(parts):
        return text
    return re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip()


async def forget_fact(db: Database, user_id: str, fact_id: int) -> dict[str, int] | None:
    """Delete the user's fact ``fact_id`` and its statement from every layer (module docs), in
    one transaction. ``None`` when the user has no such fact; else the counts changed."""
    row = await db.fetchone("SELECT content FROM facts WHERE user_id = ? AND id = ?", (user_id, int(fact_id)))
    if row is None:
        return None
    return await _forget_statement(db, user_id, row["content"], "facts",
                                   ("DELETE FROM facts WHERE user_id = ? AND id = ?", (user_id, int(fact_id))))


async def forget_profile_entry(db: Database, user_id: str, entry_id: int) -> dict[str, int] | None:
    """Delete the user's profile entry ``entry_id`` and its statement from every layer, as
    ``forget_fact`` does for a fact (the /memory card's Forget on a profile line)."""
    row = await db.fetchone("SELECT entry FROM profile_entries WHERE user_id = ? AND id = ?",
                            (user_id, int(entry_id)))
    if row is None:
        return None
    return await _forget_statement(db, user_id, row["entry"], "profile_entries",
                                   ("DELETE FROM profile_entries WHERE user_id = ? AND id = ?",
                                    (user_id, int(entry_id))))


async def _forget_statement(db: Database, user_id: str, text: str, kind: str,
                            first: tuple[str, tuple]) -> dict[str, int]:
    """Run ``first`` (the item's own DELETE, counted under ``kind``) and remove the statement
    ``text`` from episodes, summaries and profile entries, in one transaction."""
    needle = Needle.of(text)
    counts = {"facts": 0, "episodes_changed": 0, "episodes_dropped": 0, "summaries_changed": 0,
              "profile_entries": 0}
    # Read and recompute first (jieba), then write in one transaction, re-checking nothing
    # changed under us would need a lock we do not want on the reply path; an episode written
    # meanwhile is the rare case and is handled by the next /forget.
    episodes = await db.fetchall("SELECT id, summary FROM episodes WHERE user_id = ?", (user_id,))
    ep_updates: list[tuple[int, str | None, list[tuple[str, str]] | None]] = []
    for ep in episodes:
        chunks = await db.fetchall("SELECT text FROM episode_chunks WHERE episode_id = ? ORDER BY seq", (ep["id"],))
        lines = session_lines([c["text"] for c in chunks])
        kept = [line for line in lines if not needle.found_in(line)]
        summary = without(ep["summary"], needle)
        if len(kept) == len(lines) and summary == ep["summary"]:
            continue
        if not summary.strip():
            summary = " ".join(kept[:6]).strip()
        if not summary:
            ep_updates.append((ep["id"], None, None))
            continue
        ep_updates.append((ep["id"], summary, prepare_chunks(kept) if len(kept) != len(lines) else None))
    sessions = [r["session_id"] for r in await db.fetchall(
        "SELECT DISTINCT session_id FROM messages WHERE sender_id = ?"
        " UNION SELECT id AS session_id FROM sessions WHERE owner_id = ?", (user_id, user_id))]
    warm_updates: list[tuple[int, str]] = []
    rolling_updates: list[tuple[str, str]] = []
    for sid in sessions:
        for w in await db.fetchall("SELECT id, summary FROM warm_summaries WHERE session_id = ?", (sid,)):
            new = without(w["summary"], needle)
            if new != w["summary"]:
                warm_updates.append((w["id"], new))
        st = await db.fetchone("SELECT rolling_summary FROM consolidation_state WHERE session_id = ?", (sid,))
        if st is not None and st["rolling_summary"]:
            new = without(st["rolling_summary"], needle)
            if new != st["rolling_summary"]:
                rolling_updates.append((sid, new))
    profile_ids = [r["id"] for r in await db.fetchall(
        "SELECT id, entry FROM profile_entries WHERE user_id = ?", (user_id,)) if needle.found_in(r["entry"])]

    async with db.transaction() as tx:
        await serialize_tx(tx, "user", user_id)
        cur = await tx.execute(*first)
        counts[kind] = cur.rowcount
        await cur.close()
        for eid, summary, chunks in ep_updates:
            if summary is None:
                cur = await tx.execute("DELETE FROM episodes WHERE user_id = ? AND id = ?", (user_id, eid))
                counts["episodes_dropped"] += cur.rowcount
                await cur.close()
                continue
            keywords = extract_keywords(summary)
            cur = await tx.execute(
                "UPDATE episodes SET summary = ?, keywords = ?, terms = ? WHERE user_id = ? AND id = ?",
                (summary, json.dumps(keywords, ensure_ascii=False), summary_terms(summary, keywords), user_id, eid))
            await cur.close()
            if chunks is not None:
                await write_chunks(tx, eid, chunks)
            counts["episodes_changed"] += 1
        for wid, summary in warm_updates:
            cur = await tx.execute("UPDATE warm_summaries SET summary = ? WHERE id = ?", (summary, wid))
            await cur.close()
            counts["summaries_changed"] += 1
        for sid, summary in rolling_updates:
            cur = await tx.execute("UPDATE consolidation_state SET rolling_summary = ? WHERE session_id = ?",
                                   (summary, sid))
            await cur.close()
            counts["summaries_changed"] += 1
        for pid in profile_ids:
            cur = await tx.execute("DELETE FROM profile_entries WHERE user_id = ? AND id = ?", (user_id, pid))
            counts["profile_entries"] += cur.rowcount
            await cur.close()
    return counts


def describe(counts: dict[str, Any]) -> str:
    """A short English tally for logs and the console."""
    return ", ".join(f"{k}={v}" for k, v in counts.items() if v)
