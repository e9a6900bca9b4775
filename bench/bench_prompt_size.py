"""Prompt size over a long conversation: input tokens per request at turns 10, 50, 100 and 500,
Ethan's working memory against sending the whole history.

One user talks to the agent for ``TURNS`` turns through the real memory layer and agent
(``Agent.respond``: session store, gather, system prompt, ``WorkingMemory.build_context``, the
tool loop against the fake model over loopback), with the ``ConsolidationQueue`` running
against the same fake model, which answers ``write_summary`` (compression, fold) and
``extract_memories`` (two facts per extraction). After each turn the benchmark waits until
consolidation is idle, so every request sees the memory as consolidated as it can be.

Tokens are counted from what the fake model received (``RecordedRequest.input_tokens``,
ceil(characters / 4) over tools + system + messages). The baseline request at the same turn
carries the same persona system prompt and tools, and every stored turn verbatim.

    python -m bench.bench_prompt_size [--quick]
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import ratio, table, temp_home  # noqa: E402
from bot.agent.agent import Agent, Memory, UserTurn  # noqa: E402
from bot.llm.anthropic_model import AnthropicChatModel, make_client  # noqa: E402
from bot.agent.prompt import MemoryBlocks, build_system  # noqa: E402
from bot.core.reply import CollectingReply  # noqa: E402
from bot.tools import TOOL_SPECS  # noqa: E402
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
from tests.fakes.fake_anthropic import FakeAnthropic, Text, system_text  # noqa: E402

SEED = 20260611
MODEL = "claude-sonnet-4-6"

USER_LINES = [
    "我最近在准备把公司的订单服务从单体拆成微服务，数据库用的是 PostgreSQL，你觉得第一步应该做什么？",
    "Can you help me draft an email to the design team about moving the review to Thursday?",
    "记住：我每周三下午都有组会，别在那个时间给我安排别的事情。",
    "我女儿下个月过生日，想带她去海洋馆，有什么需要提前准备的吗？",
    "What's the difference between a covering index and a composite index in SQLite?",
    "我们团队的季度预算还剩大概三十万，想投一部分在监控系统上，你怎么看？",
    "昨天上线之后接口延迟从 80ms 涨到了 300ms，日志里没有明显报错，该从哪儿查？",
    "I prefer short answers with the conclusion first, then the details if needed.",
    "帮我把这周的工作整理成一个周报，重点是数据库迁移和招聘两件事。",
    "下周要去深圳出差三天，帮我列一个行李清单。",
]
ASSISTANT_WORDS = ("好的，这个问题可以分几步来看。首先要明确目标和约束，然后评估现有系统的瓶颈，"
                   "再决定拆分的顺序。建议先从读多写少、边界清楚的模块开始，保留回滚方案，"
                   "并且在每一步都加上监控和告警，这样出了问题能第一时间发现。").split("，")


# What extraction "learns", two per extraction; after the list is exhausted facts are learned
# again (reinforced, not duplicated), so the number of active facts levels off at len(FACTS).
FACTS = [
    ("用户在上海工作，是后端工程师", "knowledge"), ("用户的公司在把订单服务从单体拆成微服务", "knowledge"),
    ("用户的数据库是 PostgreSQL", "knowledge"), ("用户每周三下午有组会，不要在那时安排别的事", "preference"),
    ("用户的女儿下个月过生日，计划去海洋馆", "knowledge"), ("用户喜欢先听结论再看细节", "preference"),
    ("用户团队的季度预算还剩约三十万", "knowledge"), ("用户决定先在监控系统上投入一部分预算", "decision"),
    ("用户下周去深圳出差三天", "knowledge"), ("用户在负责招聘两名后端工程师", "knowledge"),
    ("用户喜欢喝咖啡，不喝茶", "preference"), ("用户的代码示例偏好 Python", "preference"),
    ("用户上线后遇到接口延迟从 80ms 涨到 300ms 的问题", "knowledge"), ("用户正在学习 Rust", "knowledge"),
    ("用户希望周报突出数据库迁移和招聘", "preference"), ("用户计划今年考 AWS 认证", "decision"),
    ("用户早上工作效率最高", "preference"), ("用户的设计评审改到了周四", "decision"),
    ("用户用飞书和团队沟通", "knowledge"), ("用户不喜欢冗长的回答", "preference"),
]


def _user_text(rng: random.Random, turn: int) -> str:
    return f"{rng.choice(USER_LINES)}（第{turn}轮）"


def _assistant_text(seed_text: str) -> str:
    h = int(hashlib.sha256(seed_text.encode()).hexdigest(), 16)
    rng = random.Random(h)
    parts = [rng.choice(ASSISTANT_WORDS) for _ in range(rng.randint(8, 16))]
    return "，".join(parts) + "。"


def _install_responders(fake: FakeAnthropic) -> None:
    counter = {"n": 0}

    def chat(req: dict) -> Text:
        from tests.fakes.fake_anthropic import last_user_text

        return Text(_assistant_text(last_user_text(req)))

    def summary(req: dict) -> dict:
        system = system_text(req)
        counter["n"] += 1
        n = counter["n"]
        if "merge an earlier long-term summary" in system:
            size = 600          # the fold: at most ~300 words
        elif "record of a finished conversation" in system:
            size = 300
        else:
            size = 300          # one warm summary of 5 turns
        base = f"摘要{n}：用户在讨论订单服务拆分、组会时间、女儿生日、季度预算和接口延迟排查。"
        return {"summary": (base * (size // len(base) + 1))[:size]}

    def extract(req: dict) -> dict:
        counter["x"] = counter.get("x", 0) + 2
        picked = [FACTS[(counter["x"] - 2 + i) % len(FACTS)] for i in range(2)]
        return {"facts": [{"content": c, "category": cat, "importance": 0.8} for c, cat in picked],
                "profile_psych": []}

    fake.responder = chat
    fake.on_tool("write_summary", summary, keys={"summary"})
    fake.on_tool("extract_memories", extract, keys={"facts", "profile_psych"})


async def _run(quick: bool) -> list[str]:
    checkpoints = [10, 50] if quick else [10, 50, 100, 500]
    turns = checkpoints[-1]
    rng = random.Random(SEED)
    fake = FakeAnthropic()
    fake.start()
    rows = []
    ethan_all: dict[int, int] = {}
    t_start = time.perf_counter()
    try:
        _install_responders(fake)
        with temp_home("ethan-bench-prompt-") as home:
            db = await SqliteDatabase(home / "ethan.db").open()
            client = make_client(api_key="bench", base_url=fake.base_url)
            try:
                sessions = SessionStore(db)
                working = WorkingMemory(db, sessions, MemoryConfig())
                facts, profile, episodes = FactStore(db), ProfileStore(db), EpisodeStore(db)
                procedures, modes = ProcedureStore(db), ModeStore(db)
                consolidator = Consolidator(AnthropicChatModel(client, route_consolidation_model(MODEL)))
                queue = ConsolidationQueue(db=db, sessions=sessions, working=working, facts=facts,
                                           profile=profile, episodes=episodes, modes=modes,
                                           consolidator=consolidator)
                memory = Memory(db=db, sessions=sessions, working=working, facts=facts, procedures=procedures,
                                profile=profile, episodes=episodes, modes=modes, queue=queue)
                agent = Agent(memory, AnthropicChatModel(client, MODEL), deadline=60)
                await queue.start()
                scope = Scope(user_id="ou_long", chat_id="oc_p2p_long", chat_type="p2p")
                history: list[dict] = []
                baseline_system = build_system(MemoryBlocks())
                for t in range(1, turns + 1):
                    text = _user_text(rng, t)
                    before = len(fake.requests)
                    result = await agent.respond(UserTurn(scope=scope, text=text, message_id=f"om_long_{t}"),
                                                 CollectingReply())
                    assert result.ok, result.failure
                    ethan_req = next(r for r in fake.requests[before:] if r.kind == "chat")
                    ethan_all[t] = ethan_req.input_tokens
                    if t in checkpoints:
                        # the baseline: the same persona and tools, every stored turn verbatim
                        before = len(fake.requests)
                        await client.messages.create(
                            model=MODEL, max_tokens=2048, system=baseline_system,
                            messages=[*history, {"role": "user", "content": text}], tools=TOOL_SPECS)
                        base_req = fake.requests[before]
                        rows.append((t, ethan_req, base_req))
                    history += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
                    await queue.wait_idle(60)
                stats = queue.stats()
                await queue.drain(5)
            finally:
                await client.close()
                await db.close()
    finally:
        fake.stop()
    elapsed = time.perf_counter() - t_start
    out_rows = []
    for t, e, b in rows:
        out_rows.append((f"{t}", f"**{e.input_tokens:,}**", f"{len(e.json['messages'])}",
                         f"{len(system_text(e.json)):,}", f"{b.input_tokens:,}", f"{len(b.json['messages'])}",
                         ratio(b.input_tokens, e.input_tokens)))
    start = 50 if turns > 50 else 20
    tail = [v for k, v in ethan_all.items() if k >= start]
    flat = (f"From turn {start} to {turns}, Ethan's requests stay between {min(tail):,} and "
            f"{max(tail):,} input tokens (every turn, not only the rows above).") if tail else ""
    return [
        "### 5. Prompt size over a long conversation",
        "",
        f"One user, {turns} turns through `Agent.respond` with consolidation running against the fake model "
        f"(every turn since the last compression replayed: 10–14, warm batches of 5, extraction + fold every 20 warm turns). Input tokens per chat "
        f"request as the fake model counted them (chars ÷ 4 over tools + system + messages). Baseline: the same "
        "persona and tools with the full history. Single run: the counts are deterministic (seeded).",
        "",
        *table(["turn", "Ethan tokens", "Ethan messages", "Ethan system chars", "full history tokens",
                "full history messages", "full ÷ Ethan"], out_rows),
        "",
        flat + f" Consolidation: {stats.get('compressions', 0)} compressions, {stats.get('extractions', 0)} "
        f"extractions + folds, {stats.get('facts_written', 0)} facts written; run took {elapsed:.1f} s.",
    ]


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
