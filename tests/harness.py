"""Run the whole bot against the wire fakes: real signed, encrypted webhook requests in;
replies observed at the fake Lark Open API; model requests observed at the fake Messages API.

    async with Harness(tmp_path) as h:
        ev = await h.send_text("hello")              # posts a signed, encrypted event
        [reply] = h.lark.wait_for_messages(1)
        assert h.model.chat_requests()

``provider="openai"`` (or the ``model_provider`` fixture, tests/conftest.py, which runs a
module over both adapters) puts the bot on the OpenAI-compatible adapter against
:class:`tests.fakes.fake_openai.FakeOpenAI` with ``ETHAN_PROVIDER=openai ETHAN_MODEL=gpt-4o``;
the fakes record requests in one shape, so the same assertions hold on both.

The fakes run on their own threads (lark-oapi-style blocking token fetches would deadlock a
fake on the test's loop); the app runs on the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bot.app import EthanApp
from bot.infra.config import Settings
from memory.working.view import MemoryConfig
from tests.fakes.fake_anthropic import FakeAnthropic
from tests.fakes.fake_lark import FakeLark
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.lark_events import make_text_event, webhook_request

# Set per test by tests/conftest.py under `pytest --backend=postgres`: the apps a test starts
# then keep their memory in that test's own PostgreSQL database instead of $ETHAN_HOME.
DATABASE_URL = {"url": ""}

ENCRYPT_KEY = "test-encrypt-key"
VERIFICATION_TOKEN = "vtoken"
BOT_OPEN_ID = "ou_bot"
PROVIDERS = ("anthropic", "openai")
MAIN_MODEL = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o"}
# Set by the ``model_provider`` fixture for the test it runs (tests/conftest.py).
default_provider = "anthropic"


def make_settings(home: Path, *, lark: FakeLark | None, model: FakeAnthropic | None,
                  **overrides: Any) -> Settings:
    openai_side = isinstance(model, FakeOpenAI)
    values: dict[str, Any] = dict(
        _env_file=None,
        ethan_home=home,
        ethan_port=0,
        ethan_host="127.0.0.1",
        lark_app_id="cli_test" if lark else "",
        lark_app_secret="test-secret" if lark else "",
        lark_domain=lark.base_url if lark else "https://open.feishu.cn",
        lark_transport="webhook",
        lark_encrypt_key=ENCRYPT_KEY,
        lark_verification_token=VERIFICATION_TOKEN,
        anthropic_api_key="test-key" if model and not openai_side else "",
        anthropic_base_url=model.base_url if model and not openai_side else "",
        openai_api_key="test-key" if openai_side else "",
        openai_base_url=model.base_url if openai_side else "",
        ethan_provider="openai" if openai_side else "",
        ethan_model=MAIN_MODEL["openai" if openai_side else "anthropic"],
        ethan_consolidation_model="",
        ethan_admins=[],
        ethan_console_token="",
        ethan_reply_deadline=10.0,
        ethan_shutdown_deadline=5.0,
        ethan_database_url=DATABASE_URL["url"],
    )
    values.update(overrides)
    return Settings(**values)


def make_fake(provider: str | None = None) -> FakeAnthropic:
    """The model fake of ``provider`` (default: the running test's, see ``model_provider``)."""
    return FakeOpenAI() if (provider or default_provider) == "openai" else FakeAnthropic()


class Harness:
    def __init__(self, home: Path, *, lark: FakeLark | None = None, model: FakeAnthropic | None = None,
                 memory_config: MemoryConfig | None = None, provider: str | None = None,
                 **settings: Any) -> None:
        self.home = Path(home)
        self._own_lark = lark is None
        self._own_model = model is None
        self.lark = lark or FakeLark()
        self.model = model or make_fake(provider)
        self.provider = "openai" if isinstance(self.model, FakeOpenAI) else "anthropic"
        self.memory_config = memory_config
        self.overrides = settings
        self.app: EthanApp | None = None
        self.http: aiohttp.ClientSession | None = None

    # -- lifecycle --------------------------------------------------------------------
    async def __aenter__(self) -> "Harness":
        if self._own_lark:
            self.lark.start()
        if self._own_model:
            self.model.start()
        self.http = aiohttp.ClientSession()
        await self.start_app()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop_app()
        if self.http is not None:
            await self.http.close()
        if self._own_model:
            self.model.stop()
        if self._own_lark:
            self.lark.stop()

    @property
    def settings(self) -> Settings:
        return make_settings(self.home, lark=self.lark, model=self.model, **self.overrides)

    async def start_app(self) -> EthanApp:
        self.app = EthanApp(self.settings, memory_config=self.memory_config)
        await self.app.start()
        await asyncio.wait_for(self.app.bot_open_id(), 10)   # the identity is known
        return self.app

    async def stop_app(self) -> None:
        if self.app is not None:
            await self.app.stop()
            self.app = None

    async def restart(self) -> EthanApp:
        await self.stop_app()
        return await self.start_app()

    @property
    def url(self) -> str:
        assert self.app is not None
        return self.app.base_url

    # -- sending ----------------------------------------------------------------------
    async def post(self, event: dict, *, encrypt: bool = True, headers: dict | None = None,
                   body: bytes | None = None) -> tuple[int, str]:
        """POST one event to /lark/events exactly as Lark would (signed, encrypted)."""
        h, b = webhook_request(event, encrypt_key=ENCRYPT_KEY if encrypt else None,
                               verification_token=VERIFICATION_TOKEN)
        if headers:
            h = {**h, **headers}
        async with self.http.post(self.url + "/lark/events", data=body if body is not None else b,
                                  headers=h) as resp:
            return resp.status, await resp.text()

    async def send_text(self, text: str, *, chat_id: str = "oc_p2p_alice", chat_type: str = "p2p",
                        sender: str = "ou_alice", mention_bot: bool | None = None, **kw: Any) -> dict:
        mentions = kw.pop("mentions", None)
        if mention_bot is None:
            mention_bot = chat_type != "p2p"
        if mention_bot:
            mentions = [*(mentions or []), {"key": "@_user_bot", "id": {"open_id": BOT_OPEN_ID,
                        "union_id": "on_bot", "user_id": ""}, "name": "Ethan", "mentioned_type": "bot",
                        "tenant_key": "tk_demo"}]
            text = "@_user_bot " + text
        event = make_text_event(text, chat_id=chat_id, chat_type=chat_type, sender=sender,
                                mentions=mentions, **kw)
        status, body = await self.post(event)
        assert status == 200, (status, body)
        return event

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until every accepted event has been handled and consolidation is quiet."""
        assert self.app is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            await asyncio.wait_for(self.app.dispatcher.idle(), max(0.1, end - time.monotonic()))
            if self.app.queue.depth == 0 and not self.app.dispatcher.depth:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("bot did not become idle")

    async def replies(self, n: int, timeout: float = 10.0, **filters: Any):
        """Wait (without blocking the app's loop) until the fake Lark holds n messages."""
        return await asyncio.to_thread(self.lark.wait_for_messages, n, timeout, **filters)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


__all__ = ["Harness", "make_fake", "make_settings", "new_id", "PROVIDERS", "MAIN_MODEL", "ENCRYPT_KEY", "VERIFICATION_TOKEN", "BOT_OPEN_ID", "json"]
