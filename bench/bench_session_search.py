"""Session search (layer 1): FTS5 trigram vs LIKE at 100k and 1M messages.

Builds seeded, realistic chat histories (Chinese words drawn by frequency from jieba's
dictionary, English by a Zipf law, code-switching, topic terms at known rates; users in
p2p chats and groups) in a temporary ETHAN_HOME, then times ``SessionStore.search``
forced to FTS and forced to LIKE (the same code path: ranking, grouping per session,
snippets) and the raw queries beneath (``COUNT(*)`` of ``MATCH`` vs ``LIKE``), p50 per
query. Also reports how the database was filled: bulk insert with the FTS and counter
triggers dropped and the index rebuilt afterwards, against inserting with the triggers
active (what the app does, one message at a time).

    python -m bench.bench_session_search           # 100k and 1M messages
    python -m bench.bench_session_search --quick   # 20k messages
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from storage.sqlite import SqliteDatabase  # noqa: E402
from memory.sessions.store import SessionStore  # noqa: E402

SEED = 20260611
T_START = 1_750_000_000.0       # histories span the year before T_START + 365 days

EN_WORDS = """
the to and a of I you it is that for in we this on be can with have do not are please thanks
will just so what but if how at one it's need about get know from there should as could would
time when now think make meeting project team today tomorrow week update check look issue
review plan data report deploy server build test release fix bug change code file api user
customer question answer idea help doc draft email call share send link budget schedule
sync deadline design feature support model prompt token memory session search query index
database cache latency error log config version branch merge request pipeline staging
production metric dashboard alert retry timeout queue worker thread python sqlite lark bot
message chat group summary profile note task priority status progress blocker risk launch
roadmap quarter goal okr hiring interview offer contract invoice payment travel flight hotel
lunch dinner coffee weekend holiday birthday movie music book game gym run sleep tired happy
""".split()

# Topic terms injected at known rates, so queries have known selectivity.
TOPICS = {
    "数据库迁移": 0.0005,
    "飞书机器人": 0.005,
    "季度预算": 0.002,
    "kubernetes": 0.001,
    "deploy pipeline": 0.004,
    "latency": 0.02,
}
QUERIES = [
    ("数据库迁移", "zh, rare"),
    ("飞书机器人", "zh, medium"),
    ("季度预算", "zh, 4 chars"),
    ("服务器", "zh, natural"),
    ("kubernetes", "en, rare"),
    ("deploy pipeline", "en, phrase"),
    ("latency", "en, common"),
    ("zzqxj", "no match"),
]
FTS_REPS = 7


def like_reps(n: int) -> int:
    return 3 if n >= 1_000_000 else 5


SCOPED_QUERIES = ["飞书机器人", "latency"]
SHORT_QUERIES = [("项目", "zh, 2 chars: LIKE only")]


def _chinese_vocab(limit: int = 30000) -> tuple[list[str], list[float]]:
    import jieba

    path = Path(jieba.__file__).parent / "dict.txt"
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and 1 <= len(parts[0]) <= 4 and all("\u4e00" <= ch <= "\u9fff" for ch in parts[0]):
                rows.append((int(parts[1]), parts[0]))
    rows.sort(reverse=True)
    rows = rows[:limit]
    words = [w for _, w in rows]
    cum, total = [], 0.0
    for n, _ in rows:
        total += n
        cum.append(total)
    return words, cum


@dataclass
class Corpus:
    sessions: list[tuple] = field(default_factory=list)      # sessions table rows
    messages: list[tuple] = field(default_factory=list)      # (session_id, role, content, sender_id, sender_name, created_at)
    members: set[tuple[str, str]] = field(default_factory=set)
    conversations: list[tuple] = field(default_factory=list)
    chars: int = 0


def generate(n_messages: int, seed: int = SEED, vocab: int = 30000) -> Corpus:
    """``n_messages`` messages in sessions of 1–30 turns, seeded. Words come from long
    streams drawn once by frequency (a message is a random slice of a stream), which
    keeps generation at a few seconds per million messages."""
    rng = random.Random(seed)
    zh_words, zh_cum = _chinese_vocab(vocab)
    en_cum, total = [], 0.0
    for rank in range(len(EN_WORDS)):
        total += 1.0 / (rank + 1)
        en_cum.append(total)
    zh_stream = rng.choices(zh_words, cum_weights=zh_cum, k=min(4_000_000, 40 * n_messages + 1000))
    en_stream = rng.choices(EN_WORDS, cum_weights=en_cum, k=min(1_000_000, 10 * n_messages + 1000))
    topics = list(TOPICS.items())

    def slice_of(stream: list[str], k: int) -> list[str]:
        start = rng.randrange(len(stream) - k)
        return stream[start:start + k]

    def text(role: str) -> str:
        if rng.random() < 0.6:
            k = rng.randint(4, 30) if role == "user" else rng.randint(15, 110)
            words = slice_of(zh_stream, k)
            if rng.random() < 0.25:                     # code-switching
                words.insert(rng.randrange(k), " " + rng.choice(EN_WORDS) + " ")
            step = rng.randint(8, 14)
            for i in range(step, k, step):
                words[i] += "，"
            body = "".join(words) + rng.choice("。！？~")
        else:
            k = rng.randint(3, 25) if role == "user" else rng.randint(10, 80)
            body = " ".join(slice_of(en_stream, k))
            if rng.random() < 0.1:
                body += " " + "".join(slice_of(zh_stream, 3))
        for term, rate in topics:
            if rng.random() < rate:
                cut = rng.randrange(len(body) + 1)
                body = body[:cut] + (" " if term.isascii() else "") + term + " " + body[cut:]
        return body

    users = max(20, n_messages // 500)
    groups = max(5, users // 4)
    convs: list[tuple[str, str, list[str]]] = [(f"oc_p2p_{u}", "p2p", [f"ou_{u}"]) for u in range(users)]
    for g in range(groups):
        convs.append((f"oc_group_{g}", "group", [f"ou_{u}" for u in rng.sample(range(users), rng.randint(3, 10))]))

    c = Corpus()
    used_ids: set[str] = set()
    t = T_START
    step = 365 * 86400 / max(1, n_messages)
    last_session: dict[str, str] = {}
    while len(c.messages) < n_messages:
        conv_key, chat_type, people = rng.choice(convs)
        turns = min(rng.choice((1, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)), (n_messages - len(c.messages) + 1) // 2)
        stamp = time.strftime("%Y%m%d_%H%M", time.gmtime(t))
        while True:
            sid = f"s_{stamp}_{rng.getrandbits(16):04x}"
            if sid not in used_ids:
                used_ids.add(sid)
                break
        created, n, user_turns, title, owner = t, 0, 0, "", people[0]
        for i in range(turns):
            speaker = rng.choice(people)
            if i == 0:
                owner = speaker
            for role in ("user", "assistant"):
                if len(c.messages) >= n_messages:
                    break
                body = text(role)
                if not title:
                    title = " ".join(body.split())[:40]
                sender = speaker if role == "user" else ""
                c.messages.append((sid, role, body, sender, "", t))
                c.chars += len(body)
                if role == "user":
                    user_turns += 1
                    c.members.add((speaker, conv_key))
                n += 1
                t += step
        c.sessions.append((sid, title, "claude-sonnet-4-6", conv_key, conv_key.split("#")[0], "", chat_type,
                           owner, created, t, t + 1, n, user_turns))
        last_session[conv_key] = sid
    c.conversations = [(k, k, "", ct, None, T_START) for k, ct, _ in convs]
    return c


def _message_triggers(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    return conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'").fetchall()


def build(path: Path, corpus: Corpus, *, triggers: bool) -> dict[str, float]:
    """Fill a migrated database. ``triggers=False``: drop the message triggers, insert,
    rebuild the FTS index, restore the triggers (counters and members inserted directly)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    times: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    conn.execute("BEGIN IMMEDIATE")
    saved = _message_triggers(conn)
    conn.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)", corpus.conversations)
    if triggers:
        conn.executemany(
            "INSERT INTO sessions(id, title, model, conv_key, chat_id, thread_id, chat_type, owner_id, created_at, "
            "updated_at, closed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (s[:11] for s in corpus.sessions))
    else:
        for name, _ in saved:
            conn.execute(f"DROP TRIGGER {name}")
        conn.executemany("INSERT INTO sessions(id, title, model, conv_key, chat_id, thread_id, chat_type, owner_id, "
                         "created_at, updated_at, closed_at, message_count, user_turns) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", corpus.sessions)
        conn.executemany("INSERT INTO conversation_members(user_id, conv_key) VALUES (?, ?)", sorted(corpus.members))
    conn.executemany("INSERT INTO messages(session_id, role, content, sender_id, sender_name, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?)", corpus.messages)
    times["insert"] = time.perf_counter() - t0
    if not triggers:
        t1 = time.perf_counter()
        # No incremental merging during the rebuild, one merge at the end (about 25 % less
        # CPU than the default automerge, and a single segment to search); then the
        # default automerge again for the app's one-message-at-a-time inserts.
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', 0)")
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', 4)")
        for _, sql in saved:
            conn.execute(sql)
        times["fts"] = time.perf_counter() - t1
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    times["total"] = time.perf_counter() - t0
    times["cpu"] = time.process_time() - c0
    return times


@dataclass
class Timing:
    wall_ms: float
    cpu_ms: float        # process CPU time (the SQLite work runs in aiosqlite's thread)

    def cell(self) -> str:
        return f"{self.wall_ms:.1f} ({self.cpu_ms:.1f})"


def _p50(fn, reps: int) -> tuple[Timing, object]:
    out, wall, cpu = None, [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return Timing(statistics.median(wall) * 1000, statistics.median(cpu) * 1000), out


async def _ap50(fn, reps: int) -> tuple[Timing, object]:
    out, wall, cpu = None, [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        out = await fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return Timing(statistics.median(wall) * 1000, statistics.median(cpu) * 1000), out


def _ratio(slow: Timing, fast: Timing) -> str:
    return f"{slow.wall_ms / max(fast.wall_ms, 1e-3):.1f}×"


async def _measure(path: Path, n: int) -> list[str]:
    fast_reps, reps = FTS_REPS, like_reps(n)
    rows: list[str] = []
    raw = sqlite3.connect(str(path))
    db = await SqliteDatabase(path).open()
    try:
        store = SessionStore(db)
        heavy = raw.execute("SELECT user_id FROM conversation_members GROUP BY user_id "
                            "ORDER BY COUNT(*) DESC LIMIT 1").fetchone()[0]
        visible = raw.execute("SELECT SUM(message_count) FROM sessions WHERE conv_key IN "
                              "(SELECT conv_key FROM conversation_members WHERE user_id = ?)", (heavy,)).fetchone()[0]
        cases = [(q, note, None) for q, note in QUERIES]
        cases += [(q, f"scoped: a user who sees {visible:,} messages", heavy) for q in SCOPED_QUERIES]
        for q, note, user in cases:
            fts, hits = await _ap50(lambda: store.search(q, user_id=user, method="fts"), fast_reps)
            like, like_hits = await _ap50(lambda: store.search(q, user_id=user, method="like"), reps)
            auto, auto_hits = await _ap50(lambda: store.search(q, user_id=user), reps)
            path_used = auto_hits[0].method if auto_hits else "fts"
            assert {h.session.id for h in hits} == {h.session.id for h in like_hits} or len(hits) == 20, q
            if user is None:
                raw_fts, matches = _p50(lambda: raw.execute(
                    "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH ?", ('"' + q + '"',)).fetchone()[0],
                    fast_reps)
                raw_like, like_matches = _p50(lambda: raw.execute(
                    "SELECT COUNT(*) FROM messages WHERE content LIKE ?", (f"%{q}%",)).fetchone()[0], reps)
                assert matches == like_matches, (q, matches, like_matches)
                raw_cols = f"{raw_fts.wall_ms:.1f} | {raw_like.wall_ms:.1f} | {_ratio(raw_like, raw_fts)}"
            else:
                matches = "—"
                raw_cols = "— | — | —"
            rows.append(f"| {n:,} | `{q}` ({note}) | {matches} | {fts.cell()} | {like.cell()} | "
                        f"{_ratio(like, fts)} | {path_used}: {auto.cell()} | {raw_cols} |")
        for q, note in SHORT_QUERIES:
            auto, hits = await _ap50(lambda: store.search(q), reps)
            raw_like, matches = _p50(lambda: raw.execute(
                "SELECT COUNT(*) FROM messages WHERE content LIKE ?", (f"%{q}%",)).fetchone()[0], reps)
            rows.append(f"| {n:,} | `{q}` ({note}) | {matches} | — | {auto.cell()} | — | like: {auto.cell()} | "
                        f"— | {raw_like.wall_ms:.1f} | — |")
        tail = (await store.list(limit=1))[0].id[-9:]
        resolve, _ = await _ap50(lambda: store.resolve(tail), fast_reps)
        listed, _ = await _ap50(lambda: store.list(user_id=heavy), fast_reps)
        rows.append(f"| {n:,} | `resolve('{tail}')` / `list(user_id=…)` | — | — | — | — | "
                    f"{resolve.cell()} / {listed.cell()} | — | — | — |")
    finally:
        await db.close()
        raw.close()
    return rows


async def _run(quick: bool) -> list[str]:
    sizes = [20_000] if quick else [100_000, 1_000_000]
    trigger_size = 20_000 if quick else 100_000
    old_home = os.environ.get("ETHAN_HOME")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    build_rows: list[str] = []
    query_rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ethan-bench-") as home:
        os.environ["ETHAN_HOME"] = home
        try:
            for n in sizes:
                t0 = time.perf_counter()
                corpus = generate(n)
                gen_s = time.perf_counter() - t0
                avg = corpus.chars / len(corpus.messages)
                path = Path(home) / f"ethan-{n}.db"
                await (await SqliteDatabase(path).open()).close()
                bulk = build(path, corpus, triggers=False)
                size_mb = path.stat().st_size / 1e6
                build_rows.append(
                    f"| {n:,} | {len(corpus.sessions):,} | {avg:.0f} | {gen_s:.1f} | bulk, FTS rebuilt | "
                    f"{bulk['insert']:.1f} + {bulk['fts']:.1f} = {bulk['total']:.1f} | {bulk['cpu']:.1f} | "
                    f"{n / bulk['total']:,.0f} | {size_mb:.0f} |")
                if n == trigger_size:
                    tpath = Path(home) / f"ethan-{n}-triggers.db"
                    await (await SqliteDatabase(tpath).open()).close()
                    trig = build(tpath, corpus, triggers=True)
                    build_rows.append(
                        f"| {n:,} | {len(corpus.sessions):,} | {avg:.0f} | — | triggers active | "
                        f"{trig['total']:.1f} | {trig['cpu']:.1f} ({trig['cpu'] / bulk['cpu']:.1f}× the bulk CPU) | "
                        f"{n / trig['total']:,.0f} | {tpath.stat().st_size / 1e6:.0f} |")
                    tpath.unlink()
                del corpus
                query_rows += await _measure(path, n)
                path.unlink()
        finally:
            if old_home is None:
                os.environ.pop("ETHAN_HOME", None)
            else:
                os.environ["ETHAN_HOME"] = old_home
    return [
        "### 4. Session search: FTS5 trigram vs LIKE",
        "",
        f"Seeded corpus ({SEED}): Chinese words by jieba frequency, Zipf English, code-switching; "
        f"SQLite {sqlite3.sqlite_version}. This benchmark: {time.perf_counter() - wall0:.0f} s wall, "
        f"{time.process_time() - cpu0:.0f} s CPU (wall well above CPU means a busy machine).",
        "",
        "| messages | sessions | avg chars | generate (s) | fill | wall (s): insert + FTS | CPU (s) | messages/s | DB (MB) |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        *build_rows,
        "",
        f"p50 over {FTS_REPS} runs (FTS, raw MATCH, resolve, list) or 5 runs (LIKE, auto; 3 at 1M), "
        "ms, wall (process CPU). search = `SessionStore.search(q, method=…)`: ranked, grouped per session, "
        "snippets, limit 20; auto = the default choice (a scoped search over few messages scans them when the term is common); "
        "raw = `COUNT(*)` of `MATCH` / `LIKE`. Ratios from wall time.",
        "",
        "| messages | query | matching messages | FTS search | LIKE search | LIKE/FTS | auto | raw MATCH | raw LIKE | LIKE/MATCH |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
        *query_rows,
    ]


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
