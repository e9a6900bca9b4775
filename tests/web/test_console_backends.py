"""The operator-wide reads (memory/governance/stats.py) on both backends, driven through the console's
HTTP API and the playground, on the real app: the user list, one user's entry, /stats.

/stats's user count once used a derived table without an alias, which PostgreSQL before 16
rejects ("subquery in FROM must have an alias"): these run every such query on PostgreSQL.
"""

from __future__ import annotations

import aiohttp
import pytest

from bot.app import EthanApp
from tests.conftest import BACKENDS
from tests.web.conftest import Console, offline_settings

ADMIN = "ou_admin"


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
async def console(tmp_path, db_target):
    url = db_target if isinstance(db_target, str) else ""
    app = EthanApp(offline_settings(tmp_path, ethan_database_url=url, ethan_admins=[ADMIN]))
    await app.start()
    assert app.db.dialect == ("postgres" if url else "sqlite")
    http = aiohttp.ClientSession()
    try:
        yield Console(app, http)
    finally:
        await http.close()
        await app.stop()


async def _seed(console: Console) -> None:
    await console.play("hello there", user="ou_alice", name="Alice")
    await console.play("how are you today", user="ou_alice", name="Alice Liu")      # the latest name wins
    await console.play("记住我是产品经理", user="ou_bob", name="Bob")
    status, _ = await console.call("POST", "/api/users/ou_carol/facts", {"content": "Carol 喜欢猫", "category": "preference"})
    assert status == 201
    status, _ = await console.call("POST", "/api/users/ou_dave/procedures", {"rule": "Keep answers short"})
    assert status == 201


async def test_user_list_and_one_user(console):
    await _seed(console)
    status, body = await console.call("GET", "/api/users")
    assert status == 200
    users = {u["id"]: u for u in body["users"]}
    assert set(users) == {"ou_alice", "ou_bob", "ou_carol", "ou_dave"}
    assert users["ou_alice"]["name"] == "Alice Liu" and users["ou_alice"]["messages"] == 2
    assert users["ou_alice"]["facts"] == 0
    assert users["ou_bob"]["name"] == "Bob" and users["ou_bob"]["facts"] == 1 and users["ou_bob"]["messages"] == 1
    assert users["ou_carol"]["facts"] == 1 and users["ou_carol"]["name"] == "" and users["ou_carol"]["messages"] == 0
    assert users["ou_dave"]["procedures"] == 1
    # newest first: Dave's rule was the last thing stored
    assert body["users"][0]["id"] == "ou_dave"
    seen = [u["last_seen"] for u in body["users"]]
    assert seen == sorted(seen, reverse=True) and all(isinstance(s, float) for s in seen)

    # one user's entry is the list's entry, read for that user alone
    for uid, listed in users.items():
        status, one = await console.call("GET", f"/api/users/{uid}")
        assert status == 200 and one == listed, uid
    status, nobody = await console.call("GET", "/api/users/ou_nobody")
    assert status == 200
    assert nobody == {"id": "ou_nobody", "name": "", "last_seen": None, "facts": 0, "procedures": 0,
                      "profile_entries": 0, "episodes": 0, "messages": 0}


async def test_stats_counts_on_both_backends(console):
    await _seed(console)
    body = await console.play("/stats", user=ADMIN, name="Admin")
    assert body["status"] == "answered", body
    text = body["text"]
    # users: conversation members and owners of facts, profile or episodes (Alice, Bob, Carol);
    # the admin's /stats is a command, not a message, and opens no conversation
    assert "users 3, conversations 2, sessions 2, messages 6" in text, text
    assert "facts 2, episodes 0" in text, text


async def test_commands_answer_in_the_language_the_user_last_wrote(console):
    """/stats's language follows the admin's last message in the open session (a store read
    filtered by conversation and sender), not anyone else's."""
    await console.play("你好，今天怎么样", user=ADMIN, name="Admin")
    assert (await console.play("/stats", user=ADMIN))["text"].startswith("统计")
    await console.play("thanks, and good night", user=ADMIN)
    assert (await console.play("/stats", user=ADMIN))["text"].startswith("Stats")
