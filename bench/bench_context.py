"""Context assembly: everything memory contributes to one request, for a user with 10, 1k,
10k and 100k facts, in a database holding 1M messages.

Measured, per request, exactly what ``Agent.respond`` does between storing the user's
message and calling the model: ``ModeStore.get`` → ``Agent.gather`` (procedures, profile,
``FactStore.top`` — which also stamps ``last_accessed`` in one UPDATE — episode recall on the
full path, the working-memory view) → ``prompt.build_system`` → ``WorkingMemory.build_context``
(rolling summary, warm summaries, hot turns). Two messages: one routed to the *medium* path
(facts + profile) and one to the *full* path (also recalls past episodes).

Baseline: the spec's design — the user's facts in ``facts.json``, loaded, filtered to
confidence ≥ 0.3, sorted by (confidence, last_accessed) descending, top 15 — at the same sizes.

The database is generated once per run (seeded): background conversations by bulk
``executemany`` with the message triggers dropped (counters and members written directly).
The full-text index (``messages_fts``) is left empty — context assembly never reads it and
rebuilding it for 1M messages takes over a minute; ``bench_session_search`` measures it.
Each measured user has an open session of 40 turns whose first 25 are consolidated (rolling
summary + two warm summaries), 3 procedures, a profile of 8 entries and 12 episodes; facts
are inserted directly, so sizes above ``FactStore``'s capacity (500) are reachable.

    python -m bench.bench_context [--quick]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import median, ms, percentile, ratio, table, temp_home  # noqa: E402
from bot.agent.agent import Agent, Memory  # noqa: E402
from bot.agent.prompt import build_system  # noqa: E402
from storage import Database  # noqa: E402
from storage.sqlite import SqliteDatabase
from memory.episodes.store import EpisodeStore  # noqa: E402
from memory.text.tokenizer import warm_up  # noqa: E402
from memory.facts.store import CATEGORIES, FactStore  # noqa: E402
from memory.profile.modes import ModeStore  # noqa: E402
from memory.procedures import ProcedureStore  # noqa: E402
from memory.profile.store import ProfileStore  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.sessions.store import SessionStore  # noqa: E402
from memory.working.view import WorkingMemory  # noqa: E402

SEED = 20260611
T0 = 1_750_000_000.0
TARGET_P50 = 0.005           # at 10k facts
MEDIUM_TEXT = "帮我把这周的工作计划整理一下"
FULL_TEXT = "上次我们聊过数据库迁移的方案，后来预算和排期定下来了吗？我想接着把这件事推进下去。"

ZH = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面"
      "而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性"
      "好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第"
      "向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管")
EN = ("the to and a of I you it is that for in we this on be can with have do not are please thanks will "
      "project team meeting budget release deploy server latency schedule review report plan data").split()
TOPICS = ["数据库迁移", "季度预算", "飞书机器人", "发布排期", "客户会议", "招聘计划", "性能优化", "设计评审",
          "服务器延迟", "周报", "旅行安排", "健身计划"]


class TextPool:
    def __init__(self, rng: random.Random, n: int = 20000) -> None:
        self.rng = rng
        self.pool = []
        for _ in range(n):
            if rng.random() < 0.6:
                self.pool.append("".join(rng.choices(ZH, k=rng.randint(8, 60))))
            else:
                self.pool.append(" ".join(rng.choices(EN, k=rng.randint(4, 30))))

    def __call__(self) -> str:
        return self.rng.choice(self.pool)


# ---- building the database -----------------------------------------------------------------

def _fill_background(path: Path, n_messages: int, rng: random.Random, text: TextPool) -> float:
    """Other users' conversations: ``n_messages`` in sessions of 50, in one transaction."""
    t0 = time.perf_counter()
    per = 50
    n_sess = max(1, n_messages // per)
    users = max(10, n_sess // 5)
    sessions, messages, members = [], [], set()
    for s in range(n_sess):
        sid = f"s_{time.strftime('%Y%m%d_%H%M', time.gmtime(T0 + s * 60))}_{s:06x}"
        u = s % users
        uid, conv = f"ou_bg_{u}", f"oc_p2p_bg_{u}"
        for k in range(per):
            role = "user" if k % 2 == 0 else "assistant"
            messages.append((sid, role, text(), uid if role == "user" else "", "", T0 + s * 60 + k))
        sessions.append((sid, "", "claude-sonnet-4-6", conv, conv, "", "p2p", uid, T0 + s * 60,
                         T0 + s * 60 + per, T0 + s * 60 + per + 1, per, per // 2))
        members.add((uid, conv))
    convs = [(f"oc_p2p_bg_{u}", f"oc_p2p_bg_{u}", "", "p2p", None, T0) for u in range(users)]
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-262144")
        conn.execute("BEGIN IMMEDIATE")
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'").fetchall()
        for name, _ in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        conn.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)", convs)
        conn.executemany(
            "INSERT INTO sessions(id, title, model, conv_key, chat_id, thread_id, chat_type, owner_id, created_at,"
            " updated_at, closed_at, message_count, user_turns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            sessions)
        conn.executemany("INSERT INTO conversation_members(user_id, conv_key) VALUES (?, ?)", sorted(members))
        conn.executemany("INSERT INTO messages(session_id, role, content, sender_id, sender_name, created_at)"
                         " VALUES (?, ?, ?, ?, ?, ?)", messages)
        for _, sql in triggers:
            conn.execute(sql)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()
    return time.perf_counter() - t0


def _fill_facts(path: Path, user: str, n: int, rng: random.Random, text: TextPool) -> None:
    now = time.time()
    rows = []
    for i in range(n):
        content = f"{rng.choice(TOPICS)}：{text()[:80]} #{i}"
        conf = round(rng.uniform(0.2, 1.0), 3)
        t = now - rng.uniform(0, 365 * 86400)
        rows.append((user, content, content.lower(), rng.choice(CATEGORIES), conf, "consolidator",
                     "private", f"oc_p2p_{user}", "", t, t, t + rng.uniform(0, 86400), 0))
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO facts(user_id, content, norm, category, confidence, source, visibility, chat_id,"
            " message_id, created_at, updated_at, last_accessed, hit_count) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _facts_json(path: Path, user: str, n: int, seed: int, text: TextPool) -> None:
    """The spec's facts.json for the same number of facts (same generator, own seed)."""
    rng = random.Random(seed)
    now = time.time()
    facts = []
    for i in range(n):
        t = now - rng.uniform(0, 365 * 86400)
        facts.append({"id": f"f_{i:06d}", "content": f"{rng.choice(TOPICS)}：{text()[:80]} #{i}",
                      "category": rng.choice(CATEGORIES), "confidence": round(rng.uniform(0.2, 1.0), 3),
                      "source": "consolidator", "created_at": t, "last_accessed": t + rng.uniform(0, 86400),
                      "hit_count": 0})
    path.write_text(json.dumps(facts, ensure_ascii=False), encoding="utf-8")


def spec_top(path: Path, k: int = 15) -> list[dict]:
    """The spec's injection: load facts.json, confidence >= 0.3, by confidence then recency, top k."""
    with open(path, encoding="utf-8") as f:
        facts = json.load(f)
    facts = [x for x in facts if x["confidence"] >= 0.3]
    facts.sort(key=lambda x: (x["confidence"], x["last_accessed"]), reverse=True)
    return facts[:k]


async def _seed_user(db: Database, user: str, rng: random.Random, text: TextPool) -> tuple[Scope, str, int]:
    """A p2p user with an open 40-turn session (25 consolidated), rules, profile, episodes."""
    chat = f"oc_p2p_{user}"
    scope = Scope(user_id=user, chat_id=chat, chat_type="p2p")
    sessions = SessionStore(db)
    procedures, profile, episodes = ProcedureStore(db), ProfileStore(db), EpisodeStore(db)
    for i in range(12):   # past sessions, closed, each with its episode
        topic = TOPICS[i % len(TOPICS)]
        await episodes.write(session_id=f"s_past_{user}_{i}", user_id=user, chat_id=chat, chat_type="p2p",
                             summary=f"用户和助手讨论了{topic}的方案，预算和排期还没定下来，决定下周继续推进{topic}。"
                                     f"{text()[:60]}",
                             turn_count=6, timestamp=T0 + i * 86400)
    for rule in ("回答尽量简短，先给结论", "代码示例用 Python", "称呼我为老王"):
        await procedures.add(scope, rule, "用户明确要求")
    for section, entry in (("基本信息", "在上海工作，后端工程师"), ("基本信息", "有一个女儿"),
                           ("偏好与习惯", "喜欢喝咖啡"), ("偏好与习惯", "早上效率最高"),
                           ("技能与专长", "熟悉 Python 和 SQLite"), ("技能与专长", "正在学习 Rust"),
                           ("目标与计划", "今年要把服务迁移到 Kubernetes"), ("目标与计划", "准备考 AWS 认证")):
        try:
            await profile.update(scope, section, entry, "append", source="user_edit")
        except ValueError:
            pass
    first_id = last_id = 0
    session_id = ""
    for turn in range(40):
        r = await sessions.append_user(scope, f"{text()} ({turn})", lark_message_id=f"om_{user}_{turn}")
        session_id = r.session.id
        first_id = first_id or r.message.id
        m = await sessions.append_assistant(session_id, text() + " " + text())
        if turn == 24:
            last_id = m.id
    # consolidation done for the first 25 turns: two warm rows, the rest folded
    async with db.transaction() as tx:
        now = time.time()
        await tx.execute(
            "INSERT INTO consolidation_state(session_id, compressed_upto, extracted_upto, rolling_summary,"
            " warm_turns, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, last_id, last_id - 20, "长期记忆：" + "，".join(text()[:60] for _ in range(8)), 10, now))
        for j, (a, b) in enumerate(((first_id + 30, first_id + 39), (first_id + 40, last_id))):
            await tx.execute(
                "INSERT INTO warm_summaries(session_id, first_msg_id, last_msg_id, turns, summary, model, folded,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
                (session_id, a, b, 5, f"摘要{j}：" + text()[:200], "claude-haiku-4-5", now))
    pending = await sessions.append_user(scope, MEDIUM_TEXT, lark_message_id=f"om_{user}_current")
    return scope, session_id, pending.message.id


# ---- measuring ----------------------------------------------------------------------------

async def _time(fn, reps: int, budget_s: float) -> list[float]:
    for _ in range(5):           # warm: caches, prepared statements, jieba
        await fn()
    out: list[float] = []
    end = time.perf_counter() + budget_s
    for i in range(reps):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
        if i >= 10 and time.perf_counter() > end:
            break
    return out


def _time_sync(fn, reps: int, budget_s: float) -> list[float]:
    fn()
    out: list[float] = []
    end = time.perf_counter() + budget_s
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if i >= 5 and time.perf_counter() > end:
            break
    return out


async def _run(quick: bool) -> list[str]:
    n_messages = 20_000 if quick else 1_000_000
    sizes = [10, 1_000, 10_000] if quick else [10, 1_000, 10_000, 100_000]
    reps, budget = (60, 1.0) if quick else (400, 4.0)
    rng = random.Random(SEED)
    text = TextPool(rng)
    await asyncio.to_thread(warm_up)
    rows = []
    with temp_home("ethan-bench-ctx-") as home:
        path = home / "ethan.db"
        await (await SqliteDatabase(path).open()).close()
        fill_s = _fill_background(path, n_messages, rng, text)
        for n in sizes:
            _fill_facts(path, f"ou_ctx_{n}", n, rng, text)
        db = await SqliteDatabase(path).open()
        try:
            sessions = SessionStore(db)
            working = WorkingMemory(db, sessions)
            memory = Memory(db=db, sessions=sessions, working=working, facts=FactStore(db),
                            procedures=ProcedureStore(db), profile=ProfileStore(db), episodes=EpisodeStore(db),
                            modes=ModeStore(db), queue=None)
            agent = Agent(memory, model=None)  # type: ignore[arg-type]
            today = dt.date.today().isoformat()
            total_msgs = (await db.fetchone("SELECT COUNT(*) AS n FROM messages"))["n"]
            for n in sizes:
                user = f"ou_ctx_{n}"
                scope, sid, current = await _seed_user(db, user, rng, text)

                def assemble(message: str):
                    async def go() -> None:
                        mode = await memory.modes.get(scope.user_id, scope.conv_key)
                        blocks = await agent.gather(scope, message, session_id=sid, mode=mode)
                        build_system(blocks, today=today)
                        await working.build_context(sid, message, before_message_id=current)
                    return go

                check = await agent.gather(scope, FULL_TEXT, session_id=sid, mode="work")
                assert check.path == "full" and check.facts and check.profile and check.rules, check
                medium = await _time(assemble(MEDIUM_TEXT), reps, budget)
                full = await _time(assemble(FULL_TEXT), reps, budget)
                top = await _time(lambda: memory.facts.top(scope, k=15), reps, budget / 2)
                jpath = home / f"facts-{n}.json"
                _facts_json(jpath, user, n, SEED + n, text)
                spec = _time_sync(lambda: spec_top(jpath), reps, budget)
                rows.append((f"{n:,}", ms(median(medium), 2), ms(percentile(medium, 99), 2),
                             ms(median(full), 2), ms(percentile(full, 99), 2), ms(median(top), 2),
                             ms(median(spec), 2), ms(percentile(spec, 99), 2),
                             ratio(median(spec), median(medium)), f"{len(check.episodes)}"))
                jpath.unlink()
        finally:
            await db.close()
    at10k = next((r for r in rows if r[0] == "10,000"), None)
    verdict = ""
    if at10k is not None:
        p50 = float(at10k[1].replace(",", "")) / 1000
        met = "met" if p50 < TARGET_P50 else "NOT met"
        verdict = f" Target p50 < {TARGET_P50 * 1000:.0f} ms at 10k facts (medium path): **{met}**."
    return [
        "### 3. Context assembly",
        "",
        f"Database of {total_msgs:,} messages (filled in {fill_s:.1f} s, bulk, FTS index left empty). Per "
        "request: mode + `Agent.gather` + `build_system` + `WorkingMemory.build_context`, ms; medium path "
        "(facts, profile, rules) and full path (+ episode recall). `top` = `FactStore.top(k=15)` alone "
        "(index range scan + the `last_accessed` UPDATE). Baseline: the spec's facts.json load + filter "
        "(confidence ≥ 0.3) + sort + top 15, facts only." + verdict,
        "",
        *table(["facts", "medium p50", "medium p99", "full p50", "full p99", "`top` p50",
                "facts.json p50", "facts.json p99", "facts.json ÷ medium", "episodes recalled"], rows),
    ]


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
