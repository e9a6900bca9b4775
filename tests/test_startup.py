"""Start-up and shutdown are one ordered table of named steps (``bot/startup/steps.py``,
issue 46): read here, so a step moved in the table, or a stop that no longer mirrors its
start, fails before review.

- Shutdown runs the stops of the started steps in reverse order, and that reverse order is
  today's contract: stop intake → drain → cancel → flush → close (``STOP_PHASE``).
- A step that never started is not stopped; one whose start raised is.
- The real app runs exactly the table, and its real closes happen in that order.
- docs/internals.md "Start-up and shutdown" lists the same steps in the same order.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from bot.startup.lifespan import Boot, Lifespan, Shutdown, Step
from bot.startup.steps import STEPS

ROOT = Path(__file__).resolve().parents[1]

PHASES = ("stop intake", "drain", "cancel", "flush", "close")
# Every step that stops something, and the phase of shutdown its stop belongs to.
STOP_PHASE = {
    "lark transport": "stop intake",     # the long connection (the webhook: `closing`, 503)
    "message path": "drain",             # in-flight replies within the deadline, then the parse workers
    "delivery": "cancel",                # scheduler, retry timers, background loops; rows released
    "tools": "flush",                    # MCP servers
    "consolidation": "flush",            # embedding indexer, consolidation queue, empty sessions
    "web server": "close",
    "clients": "close",                  # Lark's client, the models, speech to text
    "database": "close",
}
# Start-up dependencies: (earlier, later).
BEFORE = [
    ("database", "memory stores"),
    ("web server", "models"),            # the offline model is served on the port
    ("models", "consolidation"),
    ("consolidation", "agent"),
    ("tools", "agent"),
    ("tools", "reminders"),
    ("reminders", "commands"),
    ("delivery", "outbox"),
    ("outbox", "lark client"),
    ("lark client", "message path"),
    ("message path", "lark transport"),  # intake needs the dispatcher
    ("lark transport", "model check"),
    ("consolidation workers", "inbox recovery"),
    ("lark client", "scheduler"),
]


def names(steps) -> list[str]:
    return [s.name for s in steps]


def test_the_step_names_are_unique_and_ready_is_last():
    assert len(set(names(STEPS))) == len(STEPS)
    assert STEPS[0].name == "database" and STEPS[-1].name == "ready"


def test_shutdown_is_the_mirror_of_start_up_in_todays_phases():
    stops = [s.name for s in reversed(STEPS) if s.stop is not None]
    assert set(stops) == set(STOP_PHASE), "a step's stop was added or removed: name its phase in STOP_PHASE"
    order = [PHASES.index(STOP_PHASE[n]) for n in stops]
    assert order == sorted(order), f"shutdown must be stop intake → drain → cancel → flush → close: {stops}"
    assert stops == ["lark transport", "message path", "delivery", "tools", "consolidation",
                     "web server", "clients", "database"]


def test_each_step_starts_after_what_it_needs():
    at = {n: i for i, n in enumerate(names(STEPS))}
    late = [(a, b) for a, b in BEFORE if at[a] > at[b]]
    assert not late, f"started too early: {late}"


def _recorded(steps, calls: list[str], fail: str = "") -> list[Step]:
    def start(step):
        async def run(app, boot):
            calls.append("start " + step.name)
            if step.name == fail:
                raise RuntimeError("boom")
        return run

    def stop(step):
        async def run(app, shutdown):
            calls.append("stop " + step.name)
        return run

    return [Step(s.name, start(s), stop(s) if s.stop is not None else None) for s in steps]


async def test_the_runner_stops_what_started_last_first():
    calls: list[str] = []
    life = Lifespan(_recorded(STEPS, calls))
    await life.start(object(), Boot())
    await life.stop(object(), Shutdown(deadline=1.0, t0=0.0))
    starts = [c[6:] for c in calls if c.startswith("start ")]
    stops = [c[5:] for c in calls if c.startswith("stop ")]
    assert starts == names(STEPS)
    assert stops == [s.name for s in reversed(STEPS) if s.stop is not None]
    await life.stop(object(), Shutdown(deadline=1.0, t0=0.0))     # a second stop stops nothing
    assert len(calls) == len(starts) + len(stops)


async def test_a_step_that_never_started_is_not_stopped():
    calls: list[str] = []
    life = Lifespan(_recorded(STEPS, calls, fail="web server"))
    with pytest.raises(RuntimeError):
        await life.start(object(), Boot())
    await life.stop(object(), Shutdown(deadline=1.0, t0=0.0))
    assert [c for c in calls if c.startswith("stop ")] == ["stop web server", "stop clients", "stop database"]


async def test_a_stop_that_fails_does_not_keep_the_database_open():
    """(issue 52) A step's stop raising used to end the shutdown there: the database, closed
    last, stayed open and its thread held the process at exit. Now it is one error line and
    every earlier step still stops."""
    from tests.reliability.support import LogCapture

    calls: list[str] = []
    steps = _recorded(STEPS, calls)
    boom = next(i for i, s in enumerate(steps) if s.name == "web server")
    recorded_stop = steps[boom].stop

    async def failing(app, shutdown):
        await recorded_stop(app, shutdown)
        raise OSError("the socket is gone")

    steps[boom] = Step(steps[boom].name, steps[boom].start, failing)
    life = Lifespan(steps)
    await life.start(object(), Boot())
    with LogCapture() as logs:
        await life.stop(object(), Shutdown(deadline=1.0, t0=0.0))
    stops = [c[5:] for c in calls if c.startswith("stop ")]
    assert stops == [s.name for s in reversed(STEPS) if s.stop is not None]
    assert stops[-1] == "database"
    [line] = logs.events("app.stop_step_failed")
    assert line["step"] == "web server" and line["error"] == "OSError: the socket is gone"


def _doc_steps() -> list[str]:
    text = (ROOT / "docs" / "internals.md").read_text()
    section = re.search(r"^## Start-up and shutdown.*?(?=^## )", text, re.S | re.M)
    assert section, "docs/internals.md has no '## Start-up and shutdown' section"
    return re.findall(r"^\d+\. `([^`]+)`", section.group(0), re.M)


def test_the_doc_lists_the_steps_in_order():
    assert _doc_steps() == names(STEPS)


# -- the real app ---------------------------------------------------------------------------

@pytest.fixture
def settings(tmp_path, monkeypatch):
    from tests.web.conftest import offline_settings

    monkeypatch.setenv("ETHAN_HOME", str(tmp_path))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "LARK_APP_ID", "LARK_APP_SECRET", "ETHAN_CONSOLE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return lambda **kw: offline_settings(tmp_path, **kw)


def _traced(app, calls: list[str]) -> None:
    """The app's own steps, each call recorded (then run)."""
    def start(step):
        async def run(a, boot):
            calls.append("start " + step.name)
            if step.start is not None:
                await step.start(a, boot)
        return run

    def stop(step):
        async def run(a, shutdown):
            calls.append("stop " + step.name)
            await step.stop(a, shutdown)
        return run

    app.lifespan = Lifespan([Step(s.name, start(s), stop(s) if s.stop is not None else None)
                             for s in app.lifespan.steps])


def _closes(app, calls: list[str]) -> None:
    """Record the real closes, in the order shutdown makes them."""
    class Runner:                     # aiohttp's AppRunner has slots: a stand-in that records
        def __init__(self, real) -> None:
            self.cleanup = real.cleanup

    app._runner = Runner(app._runner)
    for owner, attr in ((app.dispatcher, "stop"), (app.parse_pool, "stop"), (app.mcp, "stop"),
                        (app.queue, "drain"), (app._runner, "cleanup"), (app.models, "aclose"),
                        (app.db, "close")):
        real = getattr(owner, attr)

        async def wrapped(*a, _real=real, _name=f"{type(owner).__name__}.{attr}", **kw):
            calls.append(_name)
            return await _real(*a, **kw)

        setattr(owner, attr, wrapped)


async def test_the_app_runs_the_table_and_closes_in_its_order(settings):
    from bot.app import EthanApp

    app = EthanApp(settings())
    calls: list[str] = []
    _traced(app, calls)
    await app.start()
    assert app.ready and calls == ["start " + n for n in names(STEPS)]
    calls.clear()
    _closes(app, calls)
    await app.stop()
    assert [c for c in calls if c.startswith("stop ")] == \
        ["stop " + s.name for s in reversed(STEPS) if s.stop is not None]
    closes = [c for c in calls if not c.startswith("stop ")]
    assert closes == ["Dispatcher.stop", "ParsePool.stop", "McpServers.stop", "ConsolidationQueue.drain",
                      "Runner.cleanup", "Models.aclose", type(app.db).__name__ + ".close"], closes


async def test_a_start_that_fails_stops_only_the_steps_that_started(settings):
    from bot.app import EthanApp

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = EthanApp(settings(ethan_port=taken.getsockname()[1]))
        calls: list[str] = []
        _traced(app, calls)
        with pytest.raises(OSError):
            await app.start()           # the port is taken: "web server" raises
        await app.stop()
    assert calls[-3:] == ["stop web server", "stop clients", "stop database"], calls
    assert "start models" not in calls and app.models is None and app.db is not None
