"""Episode search (layer 4): ranking quality of BM25 vs the spec's term frequency, and speed.

Uses the labelled set in ``tests/memory/episodes_labelled.py``. Reports, per method,
recall@1, recall@3 and MRR over the labelled queries (search is always within the
querying user's episodes), the median query time, and for ``recall`` (the gate that decides
whether a message brings back past episodes) how many related messages recall their
episode and how many unrelated ones recall anything. The full run repeats the measures
with the table padded by other users' episodes (FTS5 keeps one set of statistics for
the whole table, so this checks that other users' rows do not upset a user's ranking).

    python -m bench.bench_episode_search          # full
    python -m bench.bench_episode_search --quick  # labelled set only
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memory.episodes import recall as episodic_recall, search as episodic_search
from memory.text import tokenizer  # noqa: E402
from storage.sqlite import SqliteDatabase  # noqa: E402
from memory.episodes.store import EpisodeStore  # noqa: E402
from memory.scope import Scope  # noqa: E402
from tests.memory import episodes_labelled as L  # noqa: E402


async def _quality(store: EpisodeStore, label_of: dict[int, str], method: str, reps: int) -> dict[str, float]:
    r1 = r3 = mrr = 0.0
    times: list[float] = []
    for user, query, relevant in L.QUERIES:
        hits: list = []
        for _ in range(reps):
            t0 = time.perf_counter()
            hits = await store.search(user, query, limit=5, method=method)
            times.append(time.perf_counter() - t0)
        labels = [label_of.get(h.id, "?") for h in hits]
        r1 += L.recall_at(labels, relevant, 1)
        r3 += L.recall_at(labels, relevant, 3)
        rank = next((i for i, lab in enumerate(labels) if lab in relevant), None)
        mrr += 1.0 / (rank + 1) if rank is not None else 0.0
    n = len(L.QUERIES)
    return {"r1": r1 / n, "r3": r3 / n, "mrr": mrr / n, "ms": statistics.median(times) * 1000}


async def _recall_gate(store: EpisodeStore, label_of: dict[int, str]) -> tuple[int, int, int, float]:
    hit = 0
    times: list[float] = []
    for user, query, relevant in L.QUERIES:
        t0 = time.perf_counter()
        kind = L.EPISODES[relevant[0]][1]     # asked where it happened: group episodes stay in their group
        got = await store.recall(Scope(user, f"oc_{user}_{kind}", kind), query)
        times.append(time.perf_counter() - t0)
        if got and label_of.get(got[0].id) in relevant:
            hit += 1
    false = 0
    for user, query in L.UNRELATED:
        if await store.recall(Scope(user, f"oc_{user}_p2p", "p2p"), query):
            false += 1
    return hit, false, len(L.UNRELATED), statistics.median(times) * 1000


async def _pad(store: EpisodeStore, users: int) -> None:
    """Other users' episodes: the labelled summaries again, under other owners."""
    for u in range(users):
        for i, (label, (_, chat_type, summary)) in enumerate(L.EPISODES.items()):
            await store.write(
                session_id=f"pad_{u}_{label}", user_id=f"ou_pad_{u}", chat_id=f"oc_pad_{u}",
                chat_type=chat_type, summary=summary, turn_count=3, timestamp=1_700_000_000 + i,
            )


async def _run(quick: bool) -> list[str]:
    await asyncio.to_thread(tokenizer.warm_up)
    lines = [
        "| table | method | recall@1 | recall@3 | MRR | median query ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    gate_lines: list[str] = []
    rounds = [("labelled", 0)] if quick else [("labelled", 0), ("+ 20 other users", 20)]
    reps = 1 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        db = await SqliteDatabase(Path(tmp) / "bench.db").open()
        try:
            store = EpisodeStore(db)
            ids = await L.load(store)
            label_of = {v: k for k, v in ids.items()}
            padded = 0
            for name, users in rounds:
                if users > padded:
                    await _pad(store, users - padded)
                    padded = users
                total = len(L.EPISODES) + padded * len(L.EPISODES)
                for method in episodic_search.METHODS:
                    q = await _quality(store, label_of, method, reps)
                    default = " (default)" if method == episodic_search.DEFAULT_METHOD else ""
                    lines.append(
                        f"| {name} ({total} episodes) | {method}{default} | {q['r1']:.3f} | {q['r3']:.3f} "
                        f"| {q['mrr']:.3f} | {q['ms']:.2f} |"
                    )
                hit, false, n_unrel, ms = await _recall_gate(store, label_of)
                gate_lines.append(
                    f"| {name} | {hit}/{len(L.QUERIES)} | {false}/{n_unrel} | {ms:.2f} |"
                )
        finally:
            await db.close()
    return [
        f"Episode search: {len(L.EPISODES)} labelled episodes of {len(L.USERS)} users, "
        f"{len(L.QUERIES)} queries, {len(L.UNRELATED)} unrelated messages.",
        "",
        *lines,
        "",
        f"Recall gate (threshold {episodic_recall.RECALL_THRESHOLD} for one matching word, "
        f"{episodic_recall.RECALL_THRESHOLD_MULTI} for {episodic_recall.RECALL_MIN_TERMS}+):",
        "",
        "| table | related messages recalling their episode first | unrelated messages recalling anything | median recall ms |",
        "|---|---:|---:|---:|",
        *gate_lines,
    ]


def run(quick: bool = False) -> list[str]:
    """Markdown lines of the report."""
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    print("\n".join(run(quick="--quick" in sys.argv[1:])))
