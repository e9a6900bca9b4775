"""``/chat`` identities (issue 32 M4) at the wire: the real app, an aiohttp client over loopback.
The token holder is an operator who names the user; admin commands need that user in
ETHAN_ADMINS *and* ``"as_admin": true``; every command over /chat is audited with its channel."""

from __future__ import annotations

import aiohttp
import pytest

from bot.app import EthanApp
from tests.web.conftest import offline_settings

pytestmark = pytest.mark.app_backends
TOKEN = "chat-test-token"


async def test_admin_over_chat_needs_the_list_and_an_explicit_request(tmp_path):
    app = EthanApp(offline_settings(tmp_path, ethan_admins=["ou_admin"], ethan_console_token=TOKEN))
    await app.start()
    url = f"http://127.0.0.1:{app.port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with aiohttp.ClientSession() as http:
            async def chat(body):
                async with http.post(url + "/chat", json=body, headers=auth) as r:
                    return r.status, await r.json()

            status, body = await chat({"user_id": "ou_admin", "text": "/stats"})
            assert status == 200 and "admin command" in body["reply"]        # not asked for: refused
            status, body = await chat({"user_id": "ou_admin", "text": "/stats", "as_admin": True})
            assert status == 200 and "admin command" not in body["reply"], body
            status, body = await chat({"user_id": "ou_mallory", "text": "/stats", "as_admin": True})
            assert status == 403 and "ETHAN_ADMINS" in body["error"]
            status, body = await chat({"user_id": "ou_admin", "text": "/stats", "as_admin": "yes"})
            assert status == 400
            # reading a user's memory over /chat: allowed (the operator), and on the record
            status, body = await chat({"user_id": "ou_victim", "text": "/memory"})
            assert status == 200
        rows = await app.db.fetchall("SELECT actor, action, detail, allowed FROM audit ORDER BY id")
        got = [(r["actor"], r["action"], r["allowed"]) for r in rows]
        assert got == [("ou_admin", "stats", 0), ("ou_admin", "stats", 1), ("ou_mallory", "as_admin", 0),
                       ("ou_victim", "memory read", 1)], got
        assert all(r["detail"].startswith("[channel: /chat]") for r in rows), [r["detail"] for r in rows]
    finally:
        await app.stop()
