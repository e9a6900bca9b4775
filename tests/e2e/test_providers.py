"""Providers at the wire: the bot on an OpenAI-compatible endpoint (the real ``openai`` SDK
against FakeOpenAI), the routed consolidation model on each provider, a fallback model
answering the same turn, and the start-up check of the main model."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
import structlog

from memory.working.view import MemoryConfig
from tests.e2e.test_metrics import healthz, scrape
from tests.fakes.fake_anthropic import Error, FakeAnthropic, Stall, Text, ToolUse
from tests.fakes.fake_openai import FakeOpenAI
from tests import harness
from tests.harness import Harness
from tests.reliability.support import LogCapture

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
SMALL = MemoryConfig(hot_size=2, compress_batch=2, warm_capacity=4)


def _consolidation_answers(fake) -> None:
    fake.on_tool("write_summary", lambda req: {"summary": "(summary)"}, keys={"summary"})
    fake.on_tool("extract_memories", lambda req: {"facts": [], "profile_psych": []},
                 keys={"facts", "profile_psych"})


async def _turn(h, text, n, **who):
    await h.send_text(text, **who)
    await h.replies(n)
    await h.idle()


async def test_gpt4o_streams_remembers_and_consolidates_on_gpt4o_mini(tmp_path):
    answer = "".join(f"第 {i} 段：流式卡片里的长回答。\n" for i in range(60))
    async with Harness(tmp_path, provider="openai", memory_config=SMALL) as h:
        assert h.app.agent.model.name == "gpt-4o" and h.app.agent.model.provider == "openai"
        _consolidation_answers(h.model)
        h.model.script(
            ToolUse("memory_write", {"content": "Alice 喜欢喝乌龙茶", "category": "preference"}),
            Text("记住了。"),
            Text(answer),
        )
        await _turn(h, "remember: 我喜欢喝乌龙茶", 1, **ALICE)
        await _turn(h, "写一篇长文", 2, **ALICE)
        for i in range(4):
            await _turn(h, f"question {i}", 3 + i, **ALICE)
        chats = h.model.chat_requests()
        assert all(r.model == "gpt-4o" and r.stream for r in chats)
        assert all("/chat/completions" in r.path for r in h.model.requests)
        # the memory tool's write is in the next request's <memory_context>
        memory = h.model.last_system_text(chats[2]).split("<memory_context>")[1]
        assert "Alice 喜欢喝乌龙茶" in memory.split("</memory_context>")[0]
        # the long answer streamed into one card
        card_msg = h.lark.messages()[1]
        assert card_msg.card_id and h.lark.card_text(card_msg.card_id).strip() == answer.strip()
        # consolidation: the routed model, on the same provider
        consolidation = [r for r in h.model.requests if r.kind != "chat"]
        assert consolidation, "no consolidation request"
        assert {r.model for r in consolidation} == {"gpt-4o-mini"}
        assert h.model.tool_requests("write_summary")    # gpt-4o-mini takes a forced function


async def test_gemini_pro_consolidates_on_flash_lite(tmp_path):
    async with Harness(tmp_path, provider="openai", ethan_model="gemini-2.5-pro", memory_config=SMALL) as h:
        _consolidation_answers(h.model)
        for i in range(5):
            await _turn(h, f"gemini question {i}", 1 + i, **ALICE)
        consolidation = [r for r in h.model.requests if r.kind != "chat"]
        assert consolidation and {r.model for r in consolidation} == {"gemini-2.5-flash-lite"}
        assert {r.model for r in h.model.chat_requests()} == {"gemini-2.5-pro"}


async def test_consolidation_model_may_name_another_provider(tmp_path):
    with FakeOpenAI() as other:
        _consolidation_answers(other)
        async with Harness(tmp_path, memory_config=SMALL, openai_api_key="k2", openai_base_url=other.base_url,
                           ethan_consolidation_model="openai:deepseek-v4-flash") as h:
            assert h.app.queue.consolidator.model == "deepseek-v4-flash"
            for i in range(5):
                await _turn(h, f"cross-provider question {i}", 1 + i, **ALICE)
            assert [r for r in h.model.requests if r.kind != "chat"] == []
            assert other.requests and {r.model for r in other.requests} == {"deepseek-v4-flash"}
            assert all(r.kind == "tool" for r in other.requests)   # caps: deepseek takes a forced function


@pytest.mark.parametrize("failure", [Error.overloaded(), Error.api_error(503), Stall(seconds=30),
                                     Error.rate_limit(retry_after=60)])
async def test_anthropic_down_fallback_answers_the_same_turn(tmp_path, failure):
    with FakeOpenAI() as fallback, LogCapture() as logs:
        fallback.script(Text("answer from the fallback"))
        async with Harness(tmp_path, ethan_reply_deadline=4, openai_api_key="k", openai_base_url=fallback.base_url,
                           ethan_fallback_models=["openai:gpt-4o-mini"]) as h:
            h.model.script(failure)
            await h.send_text("hello, are you there?", **ALICE)
            [reply] = await h.replies(1, timeout=10)
            await h.idle()
            await asyncio.sleep(0.2)
            assert reply.text == "answer from the fallback"
            assert len(h.lark.messages()) == 1
            assert len(h.model.chat_requests()) == 1 and len(fallback.chat_requests()) == 1
            assert fallback.chat_requests()[0].model == "gpt-4o-mini"
            m = await scrape(h)
            assert m.value("ethan_model_answers_total", provider="openai", model="gpt-4o-mini") == 1
            assert m.total("ethan_model_fallbacks_total") == 1
            assert m.total("ethan_model_failures_total") == 0        # the user got an answer
            rows = await h.app.db.fetchall("SELECT role, content FROM messages ORDER BY id")
            assert [r["role"] for r in rows] == ["user", "assistant"]
        [replied] = logs.events("agent.replied")
        assert (replied["model"], replied["provider"]) == ("gpt-4o-mini", "openai")
        [fell] = logs.events("model.fallback")
        assert fell["next_model"] == "gpt-4o-mini" and fell["failed_model"] == "claude-sonnet-4-6"


async def test_fallback_after_partial_streamed_text_shows_one_answer(tmp_path):
    answer = "".join(f"line {i} of the fallback's own answer\n" for i in range(60))
    with FakeOpenAI() as fallback:
        fallback.script(Text(answer))
        async with Harness(tmp_path, openai_api_key="k", openai_base_url=fallback.base_url,
                           ethan_fallback_models=["openai:gpt-4o-mini"]) as h:
            partial = "".join(f"partial {i} from the overloaded model\n" for i in range(40))
            h.model.script(Error.overloaded(after_text=partial))
            h.model.stream_delay = 0.15      # the partial text is on screen a while,
            fallback.latency = 0.5           # and so is it when the fallback starts,
            fallback.stream_delay = 0.15     # whose answer streams visibly too
            await h.send_text("write a lot", **ALICE)
            await h.idle()
            await asyncio.sleep(0.3)
            msgs = h.lark.messages()
            assert len(msgs) == 1 and msgs[0].card_id, msgs
            text = h.lark.card_text(msgs[0].card_id)
            assert text.strip() == answer.strip()
            assert "partial" not in text
            # the failed model's partial text did reach the card first, and was replaced
            streamed = [json.dumps(c.json, ensure_ascii=False) for c in h.lark.calls_to("/content")]
            assert any("partial 0" in s for s in streamed), "the partial text never streamed"
            # and was never shown together with the fallback's answer, even while streaming
            assert not any("partial 0" in s and "of the fallback's own answer" in s for s in streamed)


@pytest.mark.parametrize("failure", [Error.invalid_request("messages: bad shape"), Error.spend_limit()])
async def test_bad_request_and_spend_limit_never_fall_back(tmp_path, failure):
    with FakeOpenAI() as fallback:
        async with Harness(tmp_path, openai_api_key="k", openai_base_url=fallback.base_url,
                           ethan_fallback_models=["openai:gpt-4o-mini"]) as h:
            h.model.strict = False
            h.model.script(failure)
            await h.send_text("你好，帮我看看这个问题", **ALICE)
            [apology] = await h.replies(1, timeout=10)
            assert apology.text.startswith("抱歉")
            assert fallback.requests == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_unknown_model_at_start_one_line_and_degraded_healthz(tmp_path, provider):
    fake = FakeOpenAI() if provider == "openai" else FakeAnthropic()
    fake.unknown_models = {"gpt-4o-typo" if provider == "openai" else "claude-sonnet-9"}
    with fake, LogCapture() as logs:
        model = next(iter(fake.unknown_models))
        async with Harness(tmp_path, model=fake, ethan_model=model) as h:
            status, body = await healthz(h)
            assert status == 503 and body["status"] == "degraded" and body["ready"] is False
            assert body["model_ok"] is False
            assert body["model_problem"].startswith("ETHAN_MODEL: model ") and model in body["model_problem"]
            async with h.http.get(h.url + "/") as r:        # the console keeps serving
                assert r.status == 200
        [line] = logs.events("model.unusable")
        assert line["problem"] == body["model_problem"] and "\n" not in line["problem"]
        assert not [e for e in logs.entries if "exc_info" in e or "Traceback" in json.dumps(e, default=str)]


async def test_wrong_key_and_unreachable_endpoint_name_the_setting(tmp_path):
    with FakeOpenAI(api_key="the-right-key") as fake:
        async with Harness(tmp_path / "a", model=fake) as h:
            status, body = await healthz(h)
            assert status == 503 and body["model_problem"].startswith("OPENAI_API_KEY: rejected")
    async with Harness(tmp_path / "b", provider="openai",
                       openai_base_url=f"http://127.0.0.1:{_closed_port()}/v1") as h:
        status, body = await healthz(h)
        assert status == 503 and body["model_problem"].startswith("OPENAI_BASE_URL: cannot reach")
        # refused in milliseconds: a refused connection, not a timeout (the SDK's aiohttp
        # transport files it under APITimeoutError; its cause says Connect call failed)
        assert "(provider openai, connection refused)" in body["model_problem"], body["model_problem"]
        assert "Connect call failed" in body["model_problem"] and "timeout" not in body["model_problem"]


async def _chat(h, text="hello there"):
    async with h.http.post(h.url + "/chat", json={"user_id": "ou_api", "text": text}) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_a_misspelt_host_is_a_dns_failure_and_chat_answers_503(tmp_path, provider):
    """(issue 52) A misspelt host failed in ~100 ms and was reported as "(timeout)"; /chat then
    answered 200 with an apology. Now: "DNS lookup failed" at start-up, a refused port says
    "connection refused", and /chat is a 503 model_unusable naming the base URL."""
    setting = "OPENAI_BASE_URL" if provider == "openai" else "ANTHROPIC_BASE_URL"
    host = "http://ethan-no-such-host.invalid" + ("/v1" if provider == "openai" else "")
    async with Harness(tmp_path / "dns", provider=provider, **{setting.lower(): host}) as h:
        status, body = await healthz(h)
        line = body["model_problem"]
        assert status == 503 and line.startswith(f"{setting}: cannot reach"), line
        assert f"(provider {provider}, DNS lookup failed)" in line and "timeout" not in line, line
        status, body = await _chat(h)
        assert status == 503 and body["error"] == "model_unusable" and body["kind"] == "connection", body
        assert body["setting"] == setting and "DNS lookup failed" in body["reason"], body
    port = _closed_port()
    refused = f"http://127.0.0.1:{port}" + ("/v1" if provider == "openai" else "")
    async with Harness(tmp_path / "refused", provider=provider, **{setting.lower(): refused}) as h:
        status, body = await healthz(h)
        assert f"(provider {provider}, connection refused)" in body["model_problem"], body
        status, body = await _chat(h)
        assert status == 503 and "connection refused" in body["reason"], body


async def test_a_base_url_without_v1_is_blamed_not_the_model(tmp_path):
    """(issue 52) OPENAI_BASE_URL without /v1 (every model route 404s): the line names the base
    URL and says "add /v1?", /healthz is not ok, and /chat's 503 names OPENAI_BASE_URL, not
    ETHAN_MODEL — before, the check passed ("unverified") and the first message blamed the model."""
    with FakeOpenAI() as fake:
        root = fake.base_url.removesuffix("/v1")
        async with Harness(tmp_path, model=fake, openai_base_url=root) as h:
            status, body = await healthz(h)
            line = body["model_problem"]
            assert status == 503 and body["model_ok"] is False, body
            assert line.startswith("OPENAI_BASE_URL:") and "add /v1?" in line and "ETHAN_MODEL" not in line, line
            status, body = await _chat(h)
            assert status == 503 and body["kind"] == "not_found" and body["setting"] == "OPENAI_BASE_URL", body
            status, body = await healthz(h)
            assert body["model_problem"] == line        # the chat's 404 did not re-blame the model
            # a Lark user is not told only that the model's name is wrong
            await h.send_text("你好，帮我看看这个问题", **ALICE)
            [answer] = await h.replies(1, timeout=10)
            assert "接口地址" in answer.text and "重试也没有用" in answer.text, answer.text


async def test_an_anthropic_base_url_with_v1_is_blamed_not_the_model(tmp_path):
    """(issue 52) ANTHROPIC_BASE_URL=…/v1 (the SDK adds /v1 itself: every route 404s) was
    "ETHAN_MODEL: model … is not known"; an unknown model is still ETHAN_MODEL's."""
    with FakeAnthropic() as fake:
        async with Harness(tmp_path / "a", model=fake, anthropic_base_url=fake.base_url + "/v1") as h:
            status, body = await healthz(h)
            line = body["model_problem"]
            assert status == 503 and line.startswith("ANTHROPIC_BASE_URL:") and "remove /v1?" in line, line
            status, body = await _chat(h)
            assert status == 503 and body["setting"] == "ANTHROPIC_BASE_URL", body
        fake.unknown_models = {"claude-typo"}
        async with Harness(tmp_path / "b", model=fake, ethan_model="claude-typo") as h:
            status, body = await healthz(h)
            assert body["model_problem"].startswith("ETHAN_MODEL: model 'claude-typo' is not known"), body


async def test_a_key_not_set_is_not_a_key_rejected(tmp_path):
    """(issue 52) OPENAI_APIKEY=… set no key: the line says OPENAI_API_KEY is not set, not
    "rejected" (no key was sent)."""
    with FakeOpenAI(api_key="the-right-key") as fake:
        async with Harness(tmp_path, model=fake, openai_api_key="") as h:
            status, body = await healthz(h)
            line = body["model_problem"]
            assert status == 503 and line.startswith("OPENAI_API_KEY: not set") and "rejected" not in line, line


async def test_misspelt_names_get_one_warning_naming_the_setting(tmp_path, monkeypatch):
    """(issue 52) ETHAN_MODLE, OPENAI_BASEURL, OPENAI_APIKEY were ignored in silence (the
    defaults used; "OPENAI_API_KEY: rejected" though no key was sent). Now one start-up warning
    each naming the closest setting; names the SDKs read (OPENAI_ORG_ID) are left alone."""
    typos = {"ETHAN_MODLE": "ETHAN_MODEL", "OPENAI_BASEURL": "OPENAI_BASE_URL",
             "OPENAI_APIKEY": "OPENAI_API_KEY", "LARK_APPID": "LARK_APP_ID"}
    with FakeOpenAI(api_key="the-right-key") as fake, LogCapture() as logs:
        for name in typos:
            monkeypatch.setenv(name, "the-right-key" if name == "OPENAI_APIKEY" else "x")
        monkeypatch.setenv("OPENAI_ORG_ID", "org-test")
        monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "t")
        async with Harness(tmp_path, model=fake, openai_api_key="") as h:
            status, body = await healthz(h)
            assert body["model_problem"].startswith("OPENAI_API_KEY: not set"), body
        lines = {e["name"]: e for e in logs.events("config.unknown_setting")}
        for name, closest in typos.items():
            assert lines[name]["closest"] == closest and f"did you mean {closest}?" in lines[name]["problem"]
        assert "OPENAI_ORG_ID" not in lines and "ANTHROPIC_AUTH_TOKEN" not in lines
        assert len(logs.events("config.unknown_setting")) == len(lines)    # one line a name


@pytest.mark.parametrize("case", ["unknown model", "spent budget"])
async def test_chat_is_503_model_unusable_in_every_case_the_console_doc_lists(tmp_path, case):
    """(issue 52) docs/console.md: a refused key, an unknown model, an unreachable endpoint, a
    spent budget are each a 503 model_unusable whose reason and setting name what to fix (the
    key and the endpoint: the tests above)."""
    with FakeOpenAI() as fake:
        if case == "unknown model":
            fake.unknown_models = {"gpt-4o"}
        async with Harness(tmp_path, model=fake) as h:
            if case == "spent budget":
                fake.strict = False
                fake.script(Error.spend_limit())
            status, body = await _chat(h)
            assert status == 503 and body["error"] == "model_unusable", body
            kind, setting = {"unknown model": ("not_found", "ETHAN_MODEL"),
                             "spent budget": ("spend_limit", "OPENAI_API_KEY")}[case]
            assert body["kind"] == kind and body["setting"] == setting, body
            assert body["reason"].startswith(setting + ":"), body


@pytest.mark.slow
async def test_an_endpoint_that_never_answers_is_503_not_an_apology(tmp_path):
    """(issue 52) An endpoint the start-up check could not reach in time ("timeout"): /chat's
    timeout is that endpoint, not a passing pause — 503 model_unusable, not 200 + apology."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)            # accepts (the kernel does), never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        async with Harness(tmp_path, provider="openai", openai_base_url=url, ethan_reply_deadline=3.0) as h:
            status, body = await healthz(h)
            assert "(provider openai, timeout)" in body["model_problem"], body
            status, body = await _chat(h)
            assert status == 503 and body["kind"] == "timeout" and body["setting"] == "OPENAI_BASE_URL", body
    finally:
        silent.close()


async def test_a_refused_key_shows_in_the_console_answers_chat_503_and_tells_lark_users(tmp_path):
    """(issue 30 item 6) The console header says the model is unusable and which setting;
    POST /chat answers 503 model_unusable with the reason, not 200 with an apology; a Lark
    user is told the bot is misconfigured, not to try again."""
    with FakeOpenAI(api_key="the-right-key") as fake:
        async with Harness(tmp_path, model=fake) as h:
            async with h.http.get(h.url + "/") as r:
                page = await r.text()
            assert "model unusable: OPENAI_API_KEY" in page and "rejected by" in page
            async with h.http.post(h.url + "/chat", json={"user_id": "ou_api", "text": "hello there"}) as r:
                status, body = r.status, await r.json()
            assert status == 503, body
            assert body["error"] == "model_unusable" and body["kind"] == "auth"
            assert body["setting"] == "OPENAI_API_KEY" and body["reason"].startswith("OPENAI_API_KEY: rejected")
            await h.send_text("你好，帮我看看这个问题", **ALICE)
            [answer] = await h.replies(1, timeout=10)
            assert "配置有误" in answer.text and "重试也没有用" in answer.text and "稍后" not in answer.text


async def test_the_start_up_check_covers_fallback_and_consolidation_models(tmp_path):
    """A fallback or consolidation model that cannot work is found at start (issue 30), not
    when the main model first fails or the first session closes."""
    with FakeOpenAI(api_key="the-right-key") as openai_fake, LogCapture() as logs:
        # main: Anthropic (works); the fallback's OpenAI key is wrong
        async with Harness(tmp_path / "a", openai_api_key="wrong", openai_base_url=openai_fake.base_url,
                           ethan_fallback_models=["openai:gpt-4o-mini"]) as h:
            status, body = await healthz(h)
            assert status == 503 and body["model_problem"].startswith("ETHAN_FALLBACK_MODELS openai:gpt-4o-mini:")
            assert "OPENAI_API_KEY: rejected" in body["model_problem"]
        # consolidation on an unknown model of the same (working) provider
        openai_fake.unknown_models = {"gpt-4o-mini-typo"}
        async with Harness(tmp_path / "b", model=openai_fake, openai_api_key="the-right-key",
                           ethan_consolidation_model="openai:gpt-4o-mini-typo") as h:
            status, body = await healthz(h)
            assert status == 503 and body["model_problem"].startswith("ETHAN_CONSOLIDATION_MODEL openai:gpt-4o-mini-typo:")
        assert len(logs.events("model.unusable")) == 2


async def test_a_server_without_model_routes_is_not_a_problem(tmp_path):
    with FakeOpenAI() as fake:
        fake.retrieve_route = False         # /models/{id} 404s; the list has it
        async with Harness(tmp_path, model=fake) as h:
            status, body = await healthz(h)
            assert status == 200 and body["model_ok"] is True and body["provider"] == "openai"


async def test_usage_per_model_with_cached_tokens_in_metrics_and_stats(tmp_path):
    long = "请记住这段很长的背景说明。" * 400          # > 1024 tokens of prefix on the next turn
    async with Harness(tmp_path, provider="openai", ethan_admins=["ou_alice"]) as h:
        # turn 3's request repeats turn 2's up to the replayed long turn (the date and episodes
        # ride in front of the newest words only): a cached prefix of more than 1024 tokens
        await _turn(h, long, 1, **ALICE)
        await _turn(h, "继续", 2, **ALICE)
        await _turn(h, "再继续", 3, **ALICE)
        assert len(h.model.chat_requests()) == 3
        m = await scrape(h)
        labels = dict(provider="openai", model="gpt-4o")
        assert m.value("ethan_model_answers_total", **labels) == 3
        assert m.value("ethan_model_tokens_total", kind="input", **labels) > 0
        assert m.value("ethan_model_tokens_total", kind="output", **labels) > 0
        cached = m.value("ethan_model_tokens_total", kind="cache_read", **labels)
        assert cached >= 1024 and (cached - 1024) % 128 == 0
        await _turn(h, "/stats", 4, **ALICE)
        stats = h.lark.messages()[-1].text
        assert "openai:gpt-4o" in stats and "缓存读" in stats


@pytest.mark.parametrize("first,second", [("anthropic", "openai"), ("openai", "anthropic")])
async def test_tool_calls_stored_neutral_shown_and_a_resumed_session_replays_on_the_other_provider(
        tmp_path, monkeypatch, capsys, first, second):
    from bot.infra.cli import main

    async with Harness(tmp_path, provider=first) as h:
        h.model.script(ToolUse("memory_write", {"content": "Alice likes oolong", "category": "preference"}),
                       Text("Noted: oolong."))
        await _turn(h, "remember that I like oolong tea", 1, **ALICE)
        row = await h.app.db.fetchone("SELECT session_id, tool_calls FROM messages WHERE role = 'assistant'")
    calls = json.loads(row["tool_calls"])
    assert [b["type"] for b in calls] == ["tool_use", "tool_result"]
    assert calls[0]["name"] == "memory_write" and calls[0]["input"]["content"] == "Alice likes oolong"
    assert calls[1]["tool_use_id"] == calls[0]["id"] and not calls[1].get("is_error")
    # shown by `ethan session show`
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path))
    if harness.DATABASE_URL["url"]:    # the app ran on PostgreSQL: so does the CLI
        monkeypatch.setenv("ETHAN_DATABASE_URL", harness.DATABASE_URL["url"])
    monkeypatch.chdir(tmp_path)
    config, root = structlog.get_config(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:   # bot.infra.cli.main configures logging for the process: put the test run's back afterwards
        assert await asyncio.to_thread(main, ["session", "show", row["session_id"]]) == 0
    finally:
        structlog.configure(**config)
        root.handlers[:] = handlers
        root.setLevel(level)
    out = capsys.readouterr().out
    assert "→ tool memory_write(" in out and "Alice likes oolong" in out and "← result:" in out
    # the same conversation continues on the other provider: the answer's text is replayed,
    # the round trip is not (the strict fakes would refuse a dangling tool call or result)
    async with Harness(tmp_path, provider=second) as h:
        await _turn(h, "what tea do I like?", 1, **ALICE)
        [req] = h.model.chat_requests()
        replayed = [m for m in req.json["messages"] if m["role"] == "assistant"]
        assert any("Noted: oolong." in json.dumps(m["content"], ensure_ascii=False) for m in replayed)
        assert "tool_use" not in json.dumps(req.json["messages"]) and "tool_result" not in json.dumps(req.json["messages"])
        assert "Alice likes oolong" in h.model.last_system_text(req)
