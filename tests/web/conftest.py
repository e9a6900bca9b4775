"""Console and offline-model fixtures: the real EthanApp, no Lark credentials, no Anthropic key.

``console`` runs the app on the test's loop (API tests, aiohttp client). ``ServedApp`` runs it
on its own thread and loop, for the browser tests, whose sync Playwright API must not share a
loop with the server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app import EthanApp
from bot.infra.config import Settings
from tests import harness

CHROMIUM = os.environ.get("ETHAN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def offline_settings(home: Path, **overrides: Any) -> Settings:
    """Console only (no Lark), built-in offline model (no key), any free port."""
    values: dict[str, Any] = dict(
        _env_file=None, ethan_home=home, ethan_port=0, ethan_host="127.0.0.1",
        lark_app_id="", lark_app_secret="", anthropic_api_key="", anthropic_base_url="",
        ethan_model="claude-sonnet-4-6", ethan_consolidation_model="", ethan_console_token="",
        ethan_admins=[], ethan_reply_deadline=10.0, ethan_shutdown_deadline=5.0,
        ethan_database_url=harness.DATABASE_URL["url"],   # a PostgreSQL variant's database
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    # config.yaml is read from $ETHAN_HOME: never the developer's real one.
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "LARK_APP_ID", "LARK_APP_SECRET", "ETHAN_CONSOLE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


class Console:
    """A running app and an HTTP client for it."""

    def __init__(self, app: EthanApp, http: aiohttp.ClientSession) -> None:
        self.app = app
        self.http = http

    @property
    def url(self) -> str:
        return self.app.base_url

    async def call(self, method: str, path: str, json: Any = None, **kw: Any) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=json, **kw) as r:
            ctype = r.headers.get("Content-Type", "")
            body = await r.json() if ctype.startswith("application/json") else await r.text()
            return r.status, body

    async def play(self, text: str, *, user: str = "ou_alice", name: str = "Alice", chat: str = "p2p",
                   mention: bool = True, expect: int = 200) -> dict:
        status, body = await self.call("POST", "/api/playground",
                                       {"user_id": user, "name": name, "chat": chat, "mention": mention, "text": text})
        assert status == expect, (status, body)
        return body

    async def page(self, path: str) -> str:
        async with self.http.get(self.url + path) as r:
            assert r.status == 200, (path, r.status)
            return await r.text()


@pytest.fixture
async def console(tmp_path):
    app = EthanApp(offline_settings(tmp_path))
    await app.start()
    http = aiohttp.ClientSession()
    try:
        yield Console(app, http)
    finally:
        await http.close()
        await app.stop()


class ServedApp:
    """EthanApp on its own thread and event loop (for sync Playwright in the test thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ethan-served", daemon=True)
        self.app: EthanApp | None = None

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "ServedApp":
        self.thread.start()

        async def _start():
            self.app = EthanApp(self.settings)
            await self.app.start()

        self.run(_start())
        return self

    def stop(self) -> None:
        if self.app is not None:
            self.run(self.app.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        assert self.app is not None
        return self.app.base_url


def chromium_or_skip() -> str:
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if not path:
        pytest.skip(f"no system Chromium at {CHROMIUM} (apt-get install chromium)")
    return path
