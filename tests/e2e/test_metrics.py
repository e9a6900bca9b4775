"""/metrics and /healthz at the wire: counters move as real signed webhook requests go through
the bot, model failures come from the fake Messages API, and the Prometheus text is parsed the
way a scraper parses it.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

from bot.app import EthanApp
from tests.fakes.fake_anthropic import Delay, Error, Text, default_responder, is_chat
from tests.harness import Harness, make_settings


class Scrape:
    """One parsed /metrics answer: value(name, **labels), 0.0 for a series not yet present."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset], float] = {}
        self.families: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str) -> float:
        """Sum over every label set of ``name``."""
        return sum(v for (n, _), v in self.samples.items() if n == name)


async def scrape(h: Harness) -> Scrape:
    async with h.http.get(h.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return Scrape(await r.text())


async def healthz(h: Harness) -> tuple[int, dict]:
    async with h.http.get(h.url + "/healthz") as r:
        return r.status, await r.json()


async def wait_for(predicate, timeout: float = 5.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


EVENTS = "ethan_events_received_total"


async def test_every_series_is_exposed_with_its_type(tmp_path):
    async with Harness(tmp_path) as h:
        m = await scrape(h)
    # (prometheus_client also exposes *_created timestamps, which parse as their own gauges)
    families = {k: v for k, v in m.families.items() if not k.endswith("_created")}
    assert families == {
        "ethan_events_received": "counter",
        "ethan_webhook_refused": "counter",
        "ethan_events_ignored": "counter",
        "ethan_replies_sent": "counter",
        "ethan_model_calls": "counter",
        "ethan_model_failures": "counter",
        "ethan_model_answers": "counter",
        "ethan_model_tokens": "counter",
        "ethan_model_fallbacks": "counter",
        "ethan_consolidation_queue_depth": "gauge",
        "ethan_active_conversations": "gauge",
        "ethan_database_work": "gauge",         # PostgreSQL's engine only fills it
        "ethan_reply_latency_seconds": "histogram",
        "ethan_tool_calls": "counter",
        "ethan_tool_latency_seconds": "histogram",
        "ethan_log_lines_dropped": "counter",   # stderr closed (issue 52)
    }
    assert m.value("ethan_replies_sent_total") == 0
    from bot.infra.log import dropped_lines        # process-wide: earlier tests may have dropped some
    assert m.value("ethan_log_lines_dropped_total") == dropped_lines()
    assert m.value("ethan_reply_latency_seconds_count") == 0


async def test_counters_follow_the_traffic(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("first answer"), Error.api_error(500))
        before = await scrape(h)
        assert before.total(EVENTS) == 0

        # 1. answered
        ev = await h.send_text("hello")
        await h.replies(1)
        await h.idle()
        # 2. the same event again (Lark redelivers): stored once, not answered again
        assert (await h.post(ev))[0] == 200
        # 3. the model answers 500: the user gets an apology (counted in the next test)
        await h.send_text("second question")
        [_, apology] = await h.replies(2)
        assert apology.text and apology.text != "first answer"
        # 4. a group message that does not mention the bot: accepted, then ignored
        await h.send_text("just chatting", chat_id="oc_group_team", chat_type="group", mention_bot=False)
        # 5. a forged request: refused with 401 before anything is stored
        status, _ = await h.post(ev, headers={"X-Lark-Signature": "0" * 64})
        assert status == 401
        await h.idle()

        m = await scrape(h)
        assert m.value(EVENTS, status="accepted") == 3
        assert m.value(EVENTS, status="duplicate") == 1
        assert m.value("ethan_events_ignored_total",
                       reason="group message not addressed to the bot") == 1
        assert m.value("ethan_webhook_refused_total", reason="refused") == 1
        assert m.value("ethan_replies_sent_total") == 2          # the answer and the apology
        assert m.value("ethan_model_calls_total") == 2
        assert len(h.model.chat_requests()) == 2
        # every reply's handling time went into the histogram
        assert m.value("ethan_reply_latency_seconds_count") == 2
        assert 0 < m.value("ethan_reply_latency_seconds_sum") < 20
        assert m.value("ethan_reply_latency_seconds_bucket", le="+Inf") == 2
        assert len(h.lark.messages()) == 2


async def test_model_failures_are_counted_by_kind(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Error.api_error(500), Error.overloaded(), Text("fine again"))
        for i in range(3):
            await h.send_text(f"question {i}")
            await h.replies(i + 1)
            await h.idle()
        m = await scrape(h)
        assert m.value("ethan_model_failures_total", kind="server") == 1
        assert m.value("ethan_model_failures_total", kind="overloaded") == 1
        assert m.total("ethan_model_failures_total") == 2
        assert m.value("ethan_model_calls_total") == 3
        assert m.value("ethan_replies_sent_total") == 3     # two apologies and one answer
        assert h.lark.messages()[-1].text == "fine again"


async def test_gauges_follow_work_in_flight(tmp_path):
    async with Harness(tmp_path) as h:
        # A slow reply: one conversation has work in flight while it is being answered.
        h.model.script(Delay(1.5, Text("slow answer")), Text("second answer"))
        await h.send_text("first")
        m = await wait_for(lambda: _scrape_if(h, lambda m: m.value("ethan_active_conversations") == 1))
        assert m.value("ethan_active_conversations") == 1
        await h.replies(1)
        await h.idle()
        assert (await scrape(h)).value("ethan_active_conversations") == 0

        # Consolidation: /new closes a two-turn session, so an episode is due; the consolidation
        # model is slow, and the queue gauge shows the waiting job until it is done.
        await h.send_text("second")
        await h.replies(2)
        await h.idle()
        h.model.on(lambda req: not is_chat(req), lambda req: Delay(1.0, default_responder(req)))
        await h.send_text("/new")
        await h.replies(3)
        m = await wait_for(lambda: _scrape_if(h, lambda m: m.value("ethan_consolidation_queue_depth") >= 1))
        status, body = await healthz(h)
        assert status == 200 and body["consolidation_queue"] >= 1
        await h.idle(timeout=20)
        m = await scrape(h)
        assert m.value("ethan_consolidation_queue_depth") == 0
        assert h.model.requests and not all(is_chat(r.json) for r in h.model.requests)


async def _scrape_if(h: Harness, cond):
    m = await scrape(h)
    return m if cond(m) else None


async def test_healthz_reports_ready_database_and_transport(tmp_path):
    async with Harness(tmp_path) as h:
        status, body = await healthz(h)
    assert status == 200
    assert body["status"] == "ok"
    assert body["ready"] is True
    assert body["database"] == "open"
    assert body["transport"] == {"kind": "webhook", "ready": True}
    assert body["bot_identity"] is True
    assert body["model"] == "claude-sonnet-4-6"
    assert body["offline_model"] is False
    assert body["consolidation_queue"] == 0
    assert body["uptime_s"] >= 0


async def test_healthz_console_only(tmp_path):
    """No Lark credentials, no API key: ready, with no transport and the offline model."""
    import aiohttp

    app = EthanApp(make_settings(tmp_path, lark=None, model=None))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(app.base_url + "/healthz") as r:
                status, body = r.status, await r.json()
    finally:
        await app.stop()
    assert status == 200
    assert body["ready"] is True and body["database"] == "open"
    assert body["transport"] == {"kind": "none", "ready": True}
    assert body["offline_model"] is True


async def test_healthz_is_503_while_stopping(tmp_path):
    """Between SIGTERM and exit the server still answers: 503 "stopping", so a load balancer or
    orchestrator stops sending work while in-flight replies finish."""
    async with Harness(tmp_path) as h:
        h.model.script(Delay(1.5, Text("finished during shutdown")))
        await h.send_text("a slow one")
        await wait_for(lambda: _async(bool(h.model.chat_requests())))
        app = h.app
        stopping = asyncio.create_task(app.stop())
        try:
            await asyncio.sleep(0.1)
            async with h.http.get(app.base_url + "/healthz") as r:
                status, body = r.status, await r.json()
            assert status == 503
            assert body["ready"] is False
            assert body["status"] == "stopping"
            # alive all the same (issue 52): a liveness probe must not restart a draining process
            async with h.http.get(app.base_url + "/livez") as r:
                assert r.status == 200 and (await r.json())["state"] == "stopping"
        finally:
            await stopping
        # The in-flight reply was allowed to finish (deadline 5 s in the harness).
        [reply] = h.lark.messages()
        assert reply.text == "finished during shutdown"


async def _async(value):
    return value


async def livez(h: Harness) -> tuple[int, dict]:
    async with h.http.get(h.url + "/livez") as r:
        return r.status, await r.json()


async def test_livez_is_200_while_the_model_is_down_and_healthz_is_503(tmp_path):
    """(issue 52) Liveness is not readiness: with the model refusing the key (the fake answers
    401 to every request), /healthz is 503 "degraded" — and /livez, what Docker's HEALTHCHECK
    and HAProxy ask (deploy/), is 200, so the console that shows the problem stays reachable.
    (While stopping: test_healthz_is_503_while_stopping.)"""
    from tests.fakes.fake_openai import FakeOpenAI

    with FakeOpenAI(api_key="the-right-key") as fake:
        async with Harness(tmp_path, model=fake) as h:
            status, body = await healthz(h)
            assert status == 503 and body["status"] == "degraded", body
            status, body = await livez(h)
            assert status == 200 and body["status"] == "alive", body
            assert body["state"] == "serving", body     # what deploy/haproxy.cfg routes on
            from bot.infra.log import dropped_lines    # process-wide (tests/bot/test_log_scrub.py drops some)
            assert body["log_lines_dropped"] == dropped_lines()
