"""What the prompt cache saves: 100-turn conversations, cache-read share and billed-equivalent
input tokens per turn, against the same conversation with caching off.

One user talks to the agent in a p2p chat through the real pipeline (``Agent.respond``: session
store, gather, ``build_system``, ``WorkingMemory.build_context``, ``mark_cache``, the Anthropic
adapter over loopback) with the ``ConsolidationQueue`` running against the same fake model
(``write_summary`` for compression and folds, ``extract_memories`` two facts per extraction), so
warm summaries, folds and new facts change the prompt as they would in production. After each
turn the benchmark waits until consolidation is idle.

Two conversations, one per path (DESIGN §6): **medium** (ordinary questions; facts, profile,
rules, no recall) and **full** (long questions that recall episodes: the user has 12 earlier
sessions' episodes, so ``<related_episodes>`` changes with nearly every message). The fake model
follows Anthropic's documented caching rules for ``claude-sonnet-4-6`` (tests/fakes/fake_anthropic.py:
prefix hash per breakpoint, 20-block lookback, 1,024-token minimum, 5-minute TTL).

Each conversation runs twice on a fresh database: caching **on** (the fake honours the
breakpoints) and **off** (``FakeAnthropic.caching = False``: the same requests, every input
token at full price). Billed-equivalent input tokens = input + 1.25 × cache writes + 0.1 × cache
reads (Anthropic's 5-minute-cache prices). Counted over turns 12–100: from turn 12 on the old
layout's sliding window was measured to share 0–2 leading messages between consecutive requests.

The same two conversations then run on the OpenAI-compatible path (``ETHAN_PROVIDER=openai
ETHAN_MODEL=gpt-4o``: ``OpenAIChatModel`` and the real ``openai`` SDK, consolidation routed to
``gpt-4o-mini`` as ``build_models`` routes it) against ``tests/fakes/fake_openai.py``, which
simulates OpenAI's automatic prefix caching (longest prefix seen before, from 1,024 tokens in
128-token steps, ``prompt_tokens_details.cached_tokens``). The cache markers are stripped by the
adapter; what is cached is whatever prefix the prompt layout keeps stable. Caching **off** there is
``FakeOpenAI.cache_min_tokens`` set past any prompt (nothing is ever cached). OpenAI charges nothing
for writing the cache and bills cached input at 0.5× for gpt-4o (OpenAI's pricing page: $1.25 vs
$2.50 per 1M; 0.25× on gpt-4.1, 0.1× on gpt-5): billed-equivalent = uncached + 0.5 × cached. The
read share is the cached tokens the adapter got back in the usage (``Usage.cache_read_tokens``).

    python -m bench.bench_cost [--quick]
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_prompt_size import FACTS, _assistant_text  # noqa: E402
from bench.common import percentile, table, temp_home  # noqa: E402
from bot.agent.agent import Agent, Memory, UserTurn  # noqa: E402
from bot.llm.anthropic_model import AnthropicChatModel, make_client  # noqa: E402
from bot.agent.router import route  # noqa: E402
from bot.core.reply import CollectingReply  # noqa: E402
from memory.working.consolidation_queue import ConsolidationQueue  # noqa: E402
from memory.working.consolidator import Consolidator  # noqa: E402
from memory.models import route_consolidation_model  # noqa: E402
from storage.sqlite import SqliteDatabase  # noqa: E402
from memory.episodes.store import EpisodeStore  # noqa: E402
from memory.facts.store import FactStore  # noqa: E402
from memory.profile.modes import ModeStore  # noqa: E402
from memory.procedures import ProcedureStore  # noqa: E402
from memory.profile.store import ProfileStore  # noqa: E402
from memory.scope import Scope  # noqa: E402
from memory.sessions.store import SessionStore  # noqa: E402
from memory.working.view import MemoryConfig, WorkingMemory  # noqa: E402
from bot.llm.openai_model import OpenAIChatModel  # noqa: E402
from bot.llm.openai_model import make_client as openai_client  # noqa: E402
from tests.fakes.fake_anthropic import FakeAnthropic, Text, last_user_text, system_text  # noqa: E402
from tests.fakes.fake_openai import CACHE_MIN_TOKENS, FakeOpenAI  # noqa: E402

SEED = 20261201
MODEL = "claude-sonnet-4-6"
OPENAI_MODEL = "gpt-4o"
FIRST_COUNTED = 12
WRITE_PRICE, READ_PRICE = 1.25, 0.1
OPENAI_READ_PRICE = 0.5     # gpt-4o cached input; OpenAI bills no cache writes

MEDIUM_LINES = [
    "帮我把这周的周报整理一下", "订单服务拆分先做哪个模块？", "接口延迟涨了该怎么查",
    "Draft a short note to the design team", "监控系统预算怎么分配比较好", "下周出差的行李清单",
    "What is a covering index?", "招聘两名后端的面试题", "组会改到周四怎么通知大家",
    "女儿生日去海洋馆要准备什么", "PostgreSQL 连接池调多大合适", "帮我写一段 Go 的重试逻辑",
]
FULL_LINES = [
    "还记得我们上次讨论的订单服务拆分方案吗？我想继续往下推进，先从库存模块开始可以吗",
    "之前说过的监控系统预算分配，我们今天再细化一下，具体到每个季度该投多少钱比较合理",
    "Last time we talked about the latency regression after the release; what should I check next, in order?",
    "上次那个招聘计划，两名后端工程师的面试流程我想再调整一下，加一轮系统设计你觉得怎么样",
    "Do you remember the PostgreSQL migration plan we discussed? Let's go through the rollback steps again.",
    "我们之前聊过深圳出差的安排，这次行程改成四天了，帮我重新规划一下每天的会议和路线",
]
EPISODE_TOPICS = [
    ("订单服务拆分：先拆库存和支付，保留回滚方案，监控先行", ["订单服务", "拆分", "库存", "支付"]),
    ("监控系统预算：三十万里拿出十万做可观测性，分季度投入", ["监控", "预算", "季度"]),
    ("接口延迟排查：上线后从 80ms 涨到 300ms，怀疑连接池和慢查询", ["延迟", "连接池", "慢查询"]),
    ("招聘两名后端工程师：三轮面试，加一轮系统设计", ["招聘", "后端", "面试"]),
    ("PostgreSQL 迁移计划：分三步，先双写再切读，最后下线旧库", ["PostgreSQL", "迁移", "回滚"]),
    ("深圳出差：三天，两场客户会议，一次团队聚餐", ["深圳", "出差", "会议"]),
]


def _line(lines: list[str], rng: random.Random, turn: int) -> str:
    return f"{rng.choice(lines)}（第{turn}轮）"


def _install(fake: FakeAnthropic) -> None:
    counter = {"n": 0, "x": 0}

    def chat(req: dict) -> Text:
        return Text(_assistant_text(last_user_text(req)))

    def summary(req: dict) -> dict:
        counter["n"] += 1
        size = 600 if "merge an earlier long-term summary" in system_text(req) else 300
        base = f"摘要{counter['n']}：用户在讨论订单服务拆分、监控预算、接口延迟、招聘和出差安排。"
        return {"summary": (base * (size // len(base) + 1))[:size]}

    def extract(req: dict) -> dict:
        counter["x"] += 2
        picked = [FACTS[(counter["x"] - 2 + i) % len(FACTS)] for i in range(2)]
        return {"facts": [{"content": c, "category": cat, "importance": 0.8} for c, cat in picked],
                "profile_psych": []}

    fake.responder = chat
    fake.on_tool("write_summary", summary, keys={"summary"})
    fake.on_tool("extract_memories", extract, keys={"facts", "profile_psych"})


async def _conversation(fake: FakeAnthropic, lines: list[str], turns: int, *, caching: bool,
                        pause_every: int = 0) -> list[dict]:
    """One conversation; per turn the summed usage of its chat requests (tool rounds included).
    ``pause_every``: before every n-th turn the user is away 6 minutes (past the 5-minute TTL).
    ``fake`` a FakeOpenAI: the OpenAI-compatible path (module docstring)."""
    openai_path = isinstance(fake, FakeOpenAI)
    fake.clear()
    _install(fake)
    fake.caching = caching
    if openai_path:
        # OpenAI caches on its own: off = a minimum no prompt reaches
        fake.cache_min_tokens = CACHE_MIN_TOKENS if caching else 10 ** 9
    rng = random.Random(SEED)
    out: list[dict] = []
    with temp_home("ethan-bench-cost-") as home:
        db = await SqliteDatabase(home / "ethan.db").open()
        if openai_path:
            client = openai_client(api_key="bench", base_url=fake.base_url)
            chat_model = OpenAIChatModel(client, OPENAI_MODEL)
            consolidation_model = OpenAIChatModel(client, route_consolidation_model(OPENAI_MODEL))
        else:
            client = make_client(api_key="bench", base_url=fake.base_url)
            chat_model = AnthropicChatModel(client, MODEL)
            consolidation_model = AnthropicChatModel(client, route_consolidation_model(MODEL))
        try:
            sessions = SessionStore(db)
            working = WorkingMemory(db, sessions, MemoryConfig())
            facts, profile, episodes = FactStore(db), ProfileStore(db), EpisodeStore(db)
            procedures, modes = ProcedureStore(db), ModeStore(db)
            queue = ConsolidationQueue(db=db, sessions=sessions, working=working, facts=facts, profile=profile,
                                       episodes=episodes, modes=modes,
                                       consolidator=Consolidator(consolidation_model))
            memory = Memory(db=db, sessions=sessions, working=working, facts=facts, procedures=procedures,
                            profile=profile, episodes=episodes, modes=modes, queue=queue)
            agent = Agent(memory, chat_model, deadline=60)
            scope = Scope(user_id="ou_cost", chat_id="oc_p2p_cost", chat_type="p2p")
            # a user with history: a rule, a profile, and earlier sessions' episodes to recall
            await procedures.add(scope, "回答先给结论，再给细节", context="用户明确要求")
            await profile.update(scope, "身份与背景", "上海的后端工程师，负责订单服务", mode="append")
            for i in range(12):
                topic, keywords = EPISODE_TOPICS[i % len(EPISODE_TOPICS)]
                await episodes.write(session_id=f"s_old_{i}", user_id=scope.user_id, chat_id=scope.chat_id,
                                     chat_type="p2p", summary=f"{topic}（第{i + 1}次）", turn_count=6,
                                     keywords=keywords, timestamp=time.time() - 86400 * (30 - i))
            await queue.start()
            for t in range(1, turns + 1):
                if pause_every and t % pause_every == 0:
                    fake.advance(360)
                text = _line(lines, rng, t)
                before = len(fake.requests)
                result = await agent.respond(UserTurn(scope=scope, text=text, message_id=f"om_cost_{t}"),
                                             CollectingReply())
                assert result.ok, result.failure
                chats = [r for r in fake.requests[before:] if r.kind == "chat"]
                usage = {"turn": t, "path": route(text).name, "prompt": 0, "input": 0, "read": 0, "write": 0}
                for r in chats:
                    usage["prompt"] += r.input_tokens
                    usage["input"] += r.usage.get("input_tokens", 0)
                    usage["read"] += r.usage.get("cache_read_input_tokens", 0)
                    usage["write"] += r.usage.get("cache_creation_input_tokens", 0)
                if openai_path:
                    # the fake records no usage split; the adapter's reading of the wire usage
                    # (prompt - cached, cached) is what the bot would bill and show
                    usage["input"] = result.usage["input_tokens"]
                    usage["read"] = result.usage["cache_read_tokens"]
                    assert usage["input"] + usage["read"] == usage["prompt"], usage
                    usage["openai"] = True
                out.append(usage)
                await queue.wait_idle(60)
            await queue.drain(5)
        finally:
            await client.close()
            await db.close()
    return out


def billed(u: dict) -> float:
    if u.get("openai"):
        return u["input"] + OPENAI_READ_PRICE * u["read"]
    return u["input"] + WRITE_PRICE * u["write"] + READ_PRICE * u["read"]


async def _run(quick: bool) -> tuple[list[str], dict]:
    turns = 40 if quick else 100
    fake = FakeAnthropic()
    fake.start()
    results: dict[str, tuple[list[dict], list[dict]]] = {}
    t0 = time.perf_counter()
    try:
        for name, lines, pause in (("medium", MEDIUM_LINES, 0), ("full", FULL_LINES, 0),
                                   ("medium, away 6 min before every 5th turn", MEDIUM_LINES, 5)):
            on = await _conversation(fake, lines, turns, caching=True, pause_every=pause)
            off = await _conversation(fake, lines, turns, caching=False, pause_every=pause)
            results[name] = (on, off)
    finally:
        fake.stop()
    # The OpenAI-compatible path: the same conversations (no TTL row: the fake keeps prefixes)
    ofake = FakeOpenAI()
    ofake.start()
    oresults: dict[str, tuple[list[dict], list[dict]]] = {}
    try:
        for name, lines in (("medium", MEDIUM_LINES), ("full", FULL_LINES)):
            on = await _conversation(ofake, lines, turns, caching=True)
            off = await _conversation(ofake, lines, turns, caching=False)
            oresults[name] = (on, off)
    finally:
        ofake.stop()
    elapsed = time.perf_counter() - t0
    rows, summary = _rows(results, summary_key="")
    orows, osummary = _rows(oresults, summary_key="openai ")
    summary.update(osummary)
    orows = [r[:6] + r[7:] for r in orows]      # no "written" column: OpenAI writes for free
    lines = [
        "### 8. Prompt-cache cost over a 100-turn conversation" if not quick else
        "### 8. Prompt-cache cost over a 40-turn conversation (quick)",
        "",
        f"One p2p user, {turns} turns per path through `Agent.respond` with consolidation running against the "
        f"fake model, `{MODEL}` caching rules (1,024-token minimum, 20-block lookback, 5-minute TTL), counted over "
        f"turns {FIRST_COUNTED}–{turns}. Each conversation run twice: caching on, and caching off (the same "
        "requests, every input token at 1×). Billed-equivalent input = input + 1.25 × written + 0.1 × read. "
        "Targets: cache-read share ≥ 70 %, billed-equivalent ≤ 0.35× uncached (the first two rows). The third row "
        "shows the 5-minute TTL: a user who comes back after it finds the cache gone and pays a full write "
        "(1.25×). Deterministic (seeded): one run.",
        "",
        *table(["conversation", "turns", "prompt tokens / turn", "read from cache", "per-turn share p10 / p50",
                "turns with a cache hit", "written / turn", "uncached / turn", "billed-eq / turn (cached)",
                "billed-eq / turn (caching off)", "cached ÷ off"], rows),
        "",
        f"The OpenAI-compatible path (`ETHAN_PROVIDER=openai ETHAN_MODEL={OPENAI_MODEL}`, consolidation on "
        f"`{route_consolidation_model(OPENAI_MODEL)}`): the same conversations through `OpenAIChatModel` and the "
        "`openai` SDK against FakeOpenAI's automatic prefix caching (longest prefix seen before, from 1,024 "
        "tokens in 128-token steps, `prompt_tokens_details.cached_tokens`); caching off = no prefix ever "
        f"cached. Billed-equivalent input = uncached + {OPENAI_READ_PRICE} × cached (gpt-4o's cached-input "
        "price; writes are free; 0.25× on gpt-4.1, 0.1× on gpt-5 would save more).",
        "",
        *table(["conversation", "turns", "prompt tokens / turn", "read from cache", "per-turn share p10 / p50",
                "turns with a cache hit", "uncached / turn", "billed-eq / turn (cached)",
                "billed-eq / turn (caching off)", "cached ÷ off"], orows),
        "",
        "At the other OpenAI cached-input prices the same shares give: "
        + "; ".join(f"{name}: {_at(osummary['openai ' + name]['share'], 0.25):.2f}× at 0.25× (gpt-4.1), "
                    f"{_at(osummary['openai ' + name]['share'], 0.1):.2f}× at 0.1× (gpt-5)" for name in oresults)
        + f". Run took {elapsed:.1f} s.",
    ]
    return lines, summary


def _at(share: float, read_price: float) -> float:
    """Billed-equivalent ÷ caching off on a provider that charges nothing for writes."""
    return 1 - share + read_price * share


def _rows(results: dict[str, tuple[list[dict], list[dict]]], *, summary_key: str) -> tuple[list[tuple], dict]:
    rows, summary = [], {}
    for name, (on, off) in results.items():
        on_c = [u for u in on if u["turn"] >= FIRST_COUNTED]
        off_c = [u for u in off if u["turn"] >= FIRST_COUNTED]
        paths = sorted({u["path"] for u in on_c})
        prompt = sum(u["prompt"] for u in on_c)
        share = sum(u["read"] for u in on_c) / prompt if prompt else 0.0
        billed_on = sum(billed(u) for u in on_c) / len(on_c)
        billed_off = sum(billed(u) for u in off_c) / len(off_c)
        hits = sum(1 for u in on_c if u["read"] > 0)
        per_turn_share = [u["read"] / u["prompt"] for u in on_c if u["prompt"]]
        summary[summary_key + name] = {"share": share, "ratio": billed_on / billed_off if billed_off else 0.0}
        rows.append((
            f"**{name}** ({'/'.join(paths)})", f"{len(on_c)}",
            f"{prompt / len(on_c):,.0f}", f"**{share:.1%}**",
            f"{percentile(per_turn_share, 10):.0%} / {percentile(per_turn_share, 50):.0%}",
            f"{hits} of {len(on_c)}",
            f"{sum(u['write'] for u in on_c) / len(on_c):,.0f}", f"{sum(u['input'] for u in on_c) / len(on_c):,.0f}",
            f"{billed_on:,.0f}", f"{billed_off:,.0f}", f"**{billed_on / billed_off:.2f}×**",
        ))
    return rows, summary


def run(quick: bool = False) -> list[str]:
    lines, _ = asyncio.run(_run(quick))
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
