"""Secrets in URLs (issue 32 M7) at the wire: a model base URL with ``user:pass@`` and
``?api-key=`` never appears on ``/healthz`` or in the log (the real app, the real anthropic SDK
failing to reach it, an aiohttp client over loopback)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from bot.app import EthanApp
from tests.web.conftest import offline_settings

pytestmark = pytest.mark.app_backends


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_credentials_in_a_model_base_url_are_redacted_on_healthz_and_in_logs(tmp_path, capfd):
    url = f"http://ethan:hunter2pass@127.0.0.1:{_closed_port()}/v1?api-key=SUPERSECRETKEY"
    app = EthanApp(offline_settings(tmp_path, anthropic_api_key="sk-test-key-xxxxxxxxxxxxxxxx",
                                    anthropic_base_url=url))
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            body = ""
            for _ in range(100):                      # the start-up model check runs in the background
                async with http.get(f"http://127.0.0.1:{app.port}/healthz") as r:
                    body = await r.text()
                if "cannot reach" in body:
                    break
                await asyncio.sleep(0.1)
        assert "ANTHROPIC_BASE_URL: cannot reach http://[redacted]@127.0.0.1" in body, body
        assert "?[redacted]" in body
    finally:
        await app.stop()
    out, err = capfd.readouterr()
    for secret in ("hunter2pass", "SUPERSECRETKEY"):
        assert secret not in body and secret not in out and secret not in err, secret
    assert "[redacted]@127.0.0.1" in out + err            # the log line is there, redacted
