"""CPU per answered message on the OpenAI-compatible adapter against the Anthropic adapter,
in the same run (issue 14: target ratio ≤ 1.2×).

Two measurements, each alternating the adapters (A, B, A, B, …) so machine noise hits both:

1. **End to end**: ``python -m bot serve`` (subprocess) answering signed, encrypted webhook
   events against the fake Lark and the fake model of that provider (FakeAnthropic with
   ``ETHAN_MODEL=claude-sonnet-4-6``; FakeOpenAI with ``ETHAN_PROVIDER=openai
   ETHAN_MODEL=gpt-4o``); server CPU (``/proc``) per delivered reply.
2. **Adapter alone**: ``ChatModel.turn`` streamed calls in this process against the same fakes
   (on their own threads); CPU of the calling thread (``time.thread_time``) per call — the
   SDK, its aiohttp transport, the SSE parsing and our accumulation, nothing else.

    python -m bench.bench_providers [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Fakes, Server, median, post_all, signed_request, table, temp_home  # noqa: E402

def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "—"


TEXT = "帮我看看这个项目的预算和排期，下周要和客户开会 ({i})"
ANSWER = "好的。" + "这是一个用来测量流式回答开销的中等长度回答，包含几句话。" * 6


def _provider_env(provider: str, fakes: Fakes) -> dict[str, str]:
    if provider == "openai":
        return {"ANTHROPIC_API_KEY": "", "ANTHROPIC_BASE_URL": "", "OPENAI_API_KEY": "bench-key",
                "OPENAI_BASE_URL": fakes.model.base_url, "ETHAN_PROVIDER": "openai", "ETHAN_MODEL": "gpt-4o"}
    return {"ETHAN_MODEL": "claude-sonnet-4-6"}


def _fakes(provider: str) -> Fakes:
    from tests.fakes.fake_openai import FakeOpenAI

    fakes = Fakes()
    if provider == "openai":
        fakes.model = FakeOpenAI()
    fakes.model.responder = lambda req: ANSWER     # same text, same chunks on both
    fakes.model.stream_chunks = 12
    return fakes


def _e2e(provider: str, convs: int, per_conv: int) -> dict:
    with temp_home(f"ethan-bench-{provider}-") as home, _fakes(provider) as fakes:
        server = Server(home, fakes, **_provider_env(provider, fakes)).start()
        try:
            warm = [signed_request("hello", chat_id="oc_p2p_warm", sender="ou_warm")]
            asyncio.run(post_all(server.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(1, 30)
            reqs = [signed_request(TEXT.format(i=m), chat_id=f"oc_p2p_pv_{c}", sender=f"ou_pv_{c}")
                    for m in range(per_conv) for c in range(convs)]
            cpu0 = server.cpu_seconds()
            t0 = time.monotonic()
            asyncio.run(post_all(server.url + "/lark/events", reqs, 50))
            got = fakes.lark.wait_delivered(len(reqs) + 1, 300) - 1
            wall = time.monotonic() - t0
            cpu = server.cpu_seconds() - cpu0
            chats = [r for r in fakes.model.requests if r.kind == "chat"]
            assert chats and all(r.model == ("gpt-4o" if provider == "openai" else "claude-sonnet-4-6")
                                 for r in chats), "answered by the wrong fake"
            return {"messages": len(reqs), "delivered": got, "cpu": cpu, "wall": wall}
        finally:
            server.stop()


async def _adapter_calls(provider: str, n: int) -> float:
    """CPU seconds of this thread per streamed ``turn`` (after 5 warm-up calls)."""
    from bot.llm.anthropic_model import AnthropicChatModel
    from bot.llm.anthropic_model import make_client as anthropic_client
    from bot.llm.openai_model import OpenAIChatModel
    from bot.llm.openai_model import make_client as openai_client
    from bot.tools import TOOL_SPECS
    from memory.llm import ModelRequest, ToolSpec
    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_openai import FakeOpenAI

    fake = FakeOpenAI() if provider == "openai" else FakeAnthropic()
    fake.responder = lambda req: ANSWER
    fake.stream_chunks = 12
    fake.start()
    try:
        if provider == "openai":
            client = openai_client(api_key="bench", base_url=fake.base_url)
            model = OpenAIChatModel(client, "gpt-4o")
        else:
            client = anthropic_client(api_key="bench", base_url=fake.base_url)
            model = AnthropicChatModel(client, "claude-sonnet-4-6")
        tools = [ToolSpec(t["name"], t["description"], t["input_schema"]) for t in TOOL_SPECS]
        request = ModelRequest(system=[{"type": "text", "text": "You are Ethan." * 50, "cache": True}],
                               messages=[{"role": "user", "content": "hello there"}], tools=tools)
        seen: list[str] = []

        async def on_text(t: str) -> None:
            seen.append(t)

        try:
            for _ in range(5):
                await model.turn(request, on_text=on_text, deadline=time.monotonic() + 30)
            t0 = time.thread_time()
            for _ in range(n):
                resp = await model.turn(request, on_text=on_text, deadline=time.monotonic() + 30)
            cpu = time.thread_time() - t0
            assert resp.text == ANSWER
            return cpu / n
        finally:
            await client.close()
    finally:
        fake.stop()


def run(quick: bool = False) -> list[str]:
    rounds = 1 if quick else 3
    convs, per_conv = (30, 2) if quick else (100, 3)
    calls = 100 if quick else 400
    e2e: dict[str, list[float]] = {"anthropic": [], "openai": []}
    walls: dict[str, list[float]] = {"anthropic": [], "openai": []}
    adapter: dict[str, list[float]] = {"anthropic": [], "openai": []}
    delivered: dict[str, int] = {"anthropic": 0, "openai": 0}
    sent = 0
    t_start = time.perf_counter()
    for _ in range(rounds):
        for provider in ("anthropic", "openai"):
            r = _e2e(provider, convs, per_conv)
            e2e[provider].append(r["cpu"] / max(1, r["delivered"]))
            walls[provider].append(r["wall"])
            delivered[provider] += r["delivered"]
            sent = r["messages"]
        for provider in ("anthropic", "openai"):
            adapter[provider].append(asyncio.run(_adapter_calls(provider, calls)))
    a_e2e, o_e2e = median(e2e["anthropic"]), median(e2e["openai"])
    a_ad, o_ad = median(adapter["anthropic"]), median(adapter["openai"])
    rows = [
        ("server CPU ms per answered message (end to end)", f"{a_e2e * 1000:.2f}", f"{o_e2e * 1000:.2f}",
         ratio(o_e2e, a_e2e)),
        ("adapter CPU ms per streamed call (client thread)", f"{a_ad * 1000:.3f}", f"{o_ad * 1000:.3f}",
         ratio(o_ad, a_ad)),
        ("messages answered / sent (all rounds)", f"{delivered['anthropic']} / {sent * rounds}",
         f"{delivered['openai']} / {sent * rounds}", ""),
        ("wall time per round (s, median)", f"{median(walls['anthropic']):.1f}", f"{median(walls['openai']):.1f}", ""),
    ]
    verdict = "holds" if o_e2e <= 1.2 * a_e2e else "MISSED"
    return [
        "### 9. Model adapters: OpenAI-compatible vs Anthropic",
        "",
        f"Same run, adapters alternated, median of {rounds} round(s). End to end: `python -m bot serve` "
        f"answering {convs} conversations × {per_conv} messages (concurrency 50) against the fake Lark and "
        f"the provider's fake model (same {len(ANSWER)}-character answer streamed in 12 chunks; "
        f"Anthropic: `claude-sonnet-4-6` on FakeAnthropic; OpenAI: `gpt-4o` on FakeOpenAI), server CPU "
        f"from /proc per delivered reply. Adapter alone: {calls} sequential streamed `ChatModel.turn` "
        "calls (three tools, a cached system block), CPU of the calling thread per call.",
        "",
        *table(("measure", "Anthropic adapter", "OpenAI adapter", "OpenAI / Anthropic"), rows, "lrrr"),
        "",
        f"Target: end-to-end ratio ≤ 1.2× — **{verdict}** ({ratio(o_e2e, a_e2e)}). "
        f"Ran in {time.perf_counter() - t_start:.0f} s.",
    ]


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
