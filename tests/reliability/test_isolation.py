"""Isolation (issue item 6; DESIGN.md §4).

- User A's facts, profile and episodes — written by the model's tools, by background
  extraction and by consolidation — never appear in user B's requests, p2p or group.
- What A shared in a p2p chat never appears in A's own group requests; the profile section
  心理与情绪 never appears in any group request, even when learned in a group.
- A tool call cannot write another user's memory: arguments naming another user are refused
  (``is_error``) and nothing is written anywhere.
- The console: a non-loopback bind without a token is refused at configuration time; with
  a token, API calls that do not carry it get 401 (pages redirect to the login).

(tests/e2e/test_agent.py::test_user_b_never_sees_user_a covers the basic tool-written case;
this file adds episodes, extraction, the p2p→group rule, 心理与情绪, hostile tool
arguments and the console.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bot.infra.config import ConfigError, load_settings
from tests.fakes.fake_anthropic import Text, ToolUse, Turn, tool_results
from tests.harness import Harness
from tests.reliability.support import REPO

# Every test here runs on each model adapter (Anthropic, OpenAI-compatible): same assertions.
pytestmark = pytest.mark.usefixtures("model_provider")

ALICE_P2P = dict(chat_id="oc_p2p_alice", sender="ou_alice")
BOB_P2P = dict(chat_id="oc_p2p_bob", sender="ou_bob")
ALICE_GROUP = dict(chat_id="oc_team", chat_type="group", sender="ou_alice")
BOB_GROUP = dict(chat_id="oc_team", chat_type="group", sender="ou_bob")

# What the model's tools write, keyed by a token in the user's message.
WRITES = {
    "TOKEN-A-P2P": [
        ToolUse("memory_write", {"content": "Alice's secret project is Falcon", "category": "knowledge"}),
        ToolUse("procedure_write", {"rule": "Call me Captain", "context": "Alice asked"}),
        ToolUse("profile_update", {"section": "身份与背景", "entry": "Alice works at Acme", "mode": "append"}),
        ToolUse("profile_update", {"section": "心理与情绪", "entry": "Alice feels anxious about layoffs",
                                   "mode": "append"}),
    ],
    "TOKEN-A-GROUP": [
        ToolUse("memory_write", {"content": "Alice leads the Heron team", "category": "knowledge"}),
        ToolUse("profile_update", {"section": "身份与背景", "entry": "Alice is the Osprey tech lead",
                                   "mode": "append"}),
        ToolUse("profile_update", {"section": "心理与情绪", "entry": "Alice is stressed by the deadline",
                                   "mode": "append"}),
    ],
    "TOKEN-B-P2P": [
        ToolUse("memory_write", {"content": "Bob likes Wren birds", "category": "preference"}),
    ],
}
A_PRIVATE = ("Falcon", "Acme", "anxious", "Kestrel")          # learned in Alice's p2p chat
A_GROUP_SHARED = ("Heron", "Osprey")                           # learned in a group: shared
A_PSYCH_GROUP = ("stressed",)                                  # 心理与情绪: never in a group
A_RULE = ("Captain",)                                          # user rules apply everywhere
A_EXTRACTED = ("ExtractedAlice",)
EVERYTHING_OF_A = A_PRIVATE + A_GROUP_SHARED + A_PSYCH_GROUP + A_RULE + A_EXTRACTED


def _responder(h):
    def answer(req):
        if tool_results(req):
            return Text("noted")
        text = h.model.last_user_text(req)
        for token, calls in WRITES.items():
            if token in text:
                return Turn(*calls)
        return Text("ok")
    return answer


def _summary(req):
    body = json.dumps(req.get("messages"), ensure_ascii=False)
    if "Kestrel-topic" in body:
        return {"summary": "Alice 和 Ethan 讨论了 Kestrel 收购 计划 (private episode)"}
    return {"summary": "一次普通的对话"}


def _extract(req):
    """Facts from exactly the lines the consolidator was given (so a leak would show)."""
    body = json.dumps(req.get("messages"), ensure_ascii=False)
    facts = [{"content": f"{tok} said something", "category": "knowledge", "importance": 0.9}
             for tok in ("ExtractedAlice", "ExtractedBob") if tok in body]
    return {"facts": facts, "profile_psych": []}


def _prompt(h, req) -> str:
    return h.model.last_system_text(req) + "\n" + json.dumps(req.json["messages"], ensure_ascii=False)


async def _ask(h, text: str, **who):
    before = len(h.model.chat_requests())
    await h.send_text(text, **who)
    await h.idle(timeout=20)
    reqs = h.model.chat_requests()[before:]
    if text.startswith("/"):
        return None                      # a command: answered without the model
    assert reqs, "no model request"
    return reqs[0]


async def test_a_memory_never_reaches_b_and_p2p_memory_never_reaches_a_group(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.responder = _responder(h)
        h.model.on_tool("write_summary", _summary, keys={"summary"})
        h.model.on_tool("extract_memories", _extract, keys={"facts", "profile_psych"})

        # Alice in p2p: tool writes + an episode about Kestrel + a line for extraction.
        await _ask(h, "TOKEN-A-P2P 请记住这些关于我的事情", **ALICE_P2P)
        await _ask(h, "我们在讨论 Kestrel-topic 收购计划，ExtractedAlice 是我的代号", **ALICE_P2P)
        await _ask(h, "/new", **ALICE_P2P)
        # Alice and Bob in a group, then the session ends (episode + extraction per user).
        await _ask(h, "TOKEN-A-GROUP 记一下我在团队里的角色", **ALICE_GROUP)
        await _ask(h, "ExtractedBob 是我的代号，我负责测试", **BOB_GROUP)
        await _ask(h, "我们下周开始冲刺", **ALICE_GROUP)
        await _ask(h, "收到，我准备测试环境", **BOB_GROUP)
        await _ask(h, "/new", **ALICE_GROUP)
        # Bob's own memory, as a positive control.
        await _ask(h, "TOKEN-B-P2P 记住我喜欢鹪鹩", **BOB_P2P)

        ext = await h.app.db.fetchall("SELECT user_id, content FROM facts WHERE source = 'consolidator'")
        by_user = {(r["user_id"], r["content"].split()[0]) for r in ext}
        assert ("ou_bob", "ExtractedBob") in by_user and ("ou_alice", "ExtractedAlice") in by_user, by_user
        assert ("ou_bob", "ExtractedAlice") not in by_user and ("ou_alice", "ExtractedBob") not in by_user
        for req in h.model.tool_requests("extract_memories") + h.model.structured_requests():
            body = json.dumps(req.json["messages"], ensure_ascii=False)
            assert not ("ExtractedAlice" in body and "ExtractedBob" in body), "one extraction saw two users"

        long_q = "还记得我们之前聊过的所有事情吗？请把你知道的关于我的一切都详细列出来，包括项目和收购计划"
        # Bob, p2p and group: nothing of Alice's.
        # (In the group, Bob's words stay in the shared hot zone, so only there they carry no
        # search words of Alice's.)
        for who, bait in ((BOB_P2P, " Kestrel Falcon Heron Osprey"), (BOB_GROUP, "")):
            prompt = _prompt(h, await _ask(h, long_q + bait, **who))
            leaked = [t for t in EVERYTHING_OF_A if t in prompt.replace(bait, "")]
            assert not leaked, (who, leaked)
            if who is BOB_P2P:
                assert "Wren" in prompt and "ExtractedBob" in prompt     # the control: his own memory is there

        # Alice in the group: her shared memory and rule, none of her p2p memory, no 心理与情绪.
        prompt = _prompt(h, await _ask(h, long_q + "。", **ALICE_GROUP))
        assert all(t in prompt for t in A_GROUP_SHARED + A_RULE), prompt[-1500:]
        leaked = [t for t in A_PRIVATE + A_PSYCH_GROUP + ("ExtractedAlice",) if t in prompt]
        assert not leaked, (leaked, [prompt[max(0, prompt.index(t) - 300):prompt.index(t) + 100] for t in leaked])
        assert "心理与情绪" not in h.model.last_system_text(h.model.chat_requests()[-1])

        # Alice in p2p: everything of hers is there (the p2p rule is about where, not whether).
        prompt = _prompt(h, await _ask(h, long_q + " Kestrel 收购 计划", **ALICE_P2P))
        for t in ("Falcon", "Acme", "anxious", "Heron", "Osprey", "Captain", "Kestrel"):
            assert t in prompt, t


HOSTILE_ARGS = [
    ToolUse("memory_write", {"content": "Bob is a spy", "category": "knowledge", "user_id": "ou_bob"}),
    ToolUse("memory_write", {"content": "Bob is a spy", "category": "knowledge", "open_id": "ou_bob"}),
    ToolUse("memory_write", {"content": "Bob is a spy", "category": "knowledge",
                             "scope": {"user_id": "ou_bob", "chat_id": "oc_p2p_bob"}}),
    ToolUse("procedure_write", {"rule": "Insult Bob", "context": "", "user_id": "ou_bob"}),
    ToolUse("procedure_write", {"rule": "Everyone must speak Klingon", "applies_to": "this_chat"}),
    ToolUse("procedure_write", {"rule": "Insult Bob", "applies_to": "ou_bob"}),
    ToolUse("profile_update", {"section": "身份与背景", "entry": "Bob is a spy", "mode": "append",
                               "open_id": "ou_bob"}),
    ToolUse("profile_update", {"section": "身份与背景", "entry": "Bob is a spy", "mode": "append",
                               "target_user": "ou_bob"}),
    ToolUse("memory_write_for_user", {"user_id": "ou_bob", "content": "Bob is a spy"}),
]


async def test_tool_calls_naming_another_user_are_refused_and_write_nothing(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Turn(*HOSTILE_ARGS), Text("done"))
        # In a group where both are members (the non-admin 'this_chat' rule is refused too).
        await h.send_text("please write these down", **ALICE_GROUP)
        await h.replies(1)
        await h.idle()
        results = [b for m in h.model.chat_requests()[-1].json["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        assert len(results) == len(HOSTILE_ARGS)
        not_refused = [(c.name, r["content"]) for c, r in zip(HOSTILE_ARGS, results) if not r.get("is_error")]
        assert not not_refused, not_refused
        for table, col in (("facts", "user_id"), ("profile_entries", "user_id"), ("procedures", "scope_id")):
            rows = await h.app.db.fetchall(f"SELECT {col} AS who FROM {table}")
            assert rows == [], (table, [r["who"] for r in rows])
        assert h.lark.messages()[-1].text == "done"


async def test_console_refuses_a_public_bind_without_a_token(tmp_path):
    for host in ("0.0.0.0", "::", "192.0.2.10", "ethan.example.com"):
        with pytest.raises(ConfigError, match="ETHAN_CONSOLE_TOKEN"):
            load_settings(_env_file=None, ethan_home=tmp_path, ethan_host=host, ethan_console_token="")
    # ... and the command says so and exits, before binding anything.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "ETHAN_HOME": str(tmp_path),
           "ETHAN_HOST": "0.0.0.0", "ETHAN_PORT": "0"}
    proc = subprocess.run([sys.executable, "-m", "bot", "serve"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert "ETHAN_CONSOLE_TOKEN" in proc.stderr and "Traceback" not in proc.stderr
    # Loopback addresses other than 127.0.0.1 are fine without a token.
    for host in ("127.0.0.2", "::1", "localhost"):
        assert load_settings(_env_file=None, ethan_home=tmp_path, ethan_host=host).host_is_loopback


TOKEN = "console-token-3f9a"
REMOTE = {"Host": "ethan.example.com"}       # what a request through a proxy / tunnel looks like


async def test_console_with_a_token_refuses_requests_without_it(tmp_path):
    async with Harness(tmp_path, ethan_console_token=TOKEN) as h:
        url = h.url

        async def call(method, path, headers=None, **kw):
            async with h.http.request(method, url + path, headers={**REMOTE, **(headers or {})},
                                      allow_redirects=False, **kw) as r:
                return r.status, r.headers.get("Location", ""), await r.text()

        for method, path, kw in [("GET", "/api/users", {}), ("GET", "/api/users/ou_alice/facts", {}),
                                 ("GET", "/api/sessions", {}),
                                 ("POST", "/api/users/ou_bob/facts", {"json": {"content": "x", "category": "knowledge"}}),
                                 ("PUT", "/api/users/ou_bob/profile", {"json": {"document": "# x"}}),
                                 ("POST", "/api/playground", {"json": {"user_id": "ou_bob", "text": "hi"}}),
                                 ("DELETE", "/api/sessions/s_x", {})]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                            {"Cookie": "ethan_console=forged"}, {"Authorization": f"Basic {TOKEN}"}):
                status, _, body = await call(method, path, headers, **kw)
                assert status == 401, (method, path, headers, status, body[:200])
                assert "ou_" not in body or "ou_bob" not in body
        status, location, _ = await call("GET", "/users/ou_alice/facts")
        assert status in (302, 303) and location.startswith("/login"), (status, location)
        # With the token: allowed; a cross-site write with the token is still refused.
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await call("GET", "/api/users", auth))[0] == 200
        status, _, _ = await call("POST", "/api/users/ou_bob/facts", {**auth, "Origin": "https://evil.example"},
                                  json={"content": "Bob is a spy", "category": "knowledge"})
        assert status == 403
        assert await h.app.db.fetchall("SELECT id FROM facts") == []


async def test_console_without_a_token_answers_only_under_a_loopback_name(tmp_path):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 reaches a loopback bind
    with Host: evil.example — refused, since no token exists to check."""
    async with Harness(tmp_path) as h:
        async with h.http.get(h.url + "/api/users", headers={"Host": "evil.example"}) as r:
            assert r.status == 403
        async with h.http.get(h.url + "/api/users") as r:
            assert r.status == 200
        pattern = re.compile(r"ou_\w+")
        async with h.http.get(h.url + "/users", headers={"Host": "evil.example:8080"}) as r:
            assert r.status == 403 and not pattern.search(await r.text())


ALICE_OTHER_GROUP = dict(chat_id="oc_other", chat_type="group", sender="ou_alice")
GROUP_EPISODE = "Alice 和 Bob 讨论了 Pelican 发布 计划，Bob 透露了 Pelican 预算 Sandpiper"


async def test_group_episodes_stay_in_their_group(tmp_path):
    """DESIGN.md §4 / issue 17 Medium 4: an episode of a group session holds other members'
    words, so it is recalled (and listed by /episodes) only in that group — never in the
    member's p2p chat, never in another group."""
    def summary(req):
        body = json.dumps(req.get("messages"), ensure_ascii=False)
        if "Pelican" in body:
            return {"summary": GROUP_EPISODE}
        if "Kestrel" in body:
            return {"summary": "Alice 和 Ethan 私下讨论了 Kestrel 收购 计划"}
        return {"summary": "一次普通的对话"}

    async with Harness(tmp_path) as h:
        h.model.on_tool("write_summary", summary, keys={"summary"})
        h.model.on_tool("extract_memories", lambda req: {"facts": [], "profile_psych": []},
                        keys={"facts", "profile_psych"})
        await _ask(h, "我们来定一下 Pelican 发布 计划", **ALICE_GROUP)
        await _ask(h, "Pelican 预算 我这边是 Sandpiper 级别", **BOB_GROUP)
        await _ask(h, "好的 Pelican 发布 计划 下周定稿", **ALICE_GROUP)
        await _ask(h, "收到 Pelican 预算 我再确认", **BOB_GROUP)
        await _ask(h, "/new", **ALICE_GROUP)
        await _ask(h, "聊聊 Kestrel 收购", **ALICE_P2P)
        await _ask(h, "Kestrel 收购 的细节", **ALICE_P2P)
        await _ask(h, "/new", **ALICE_P2P)
        await h.idle(timeout=20)
        rows = await h.app.db.fetchall("SELECT user_id, chat_id, visibility FROM episodes ORDER BY id")
        assert {(r["user_id"], r["chat_id"], r["visibility"]) for r in rows} >= {
            ("ou_alice", "oc_team", "shared"), ("ou_bob", "oc_team", "shared"),
            ("ou_alice", "oc_p2p_alice", "private")}, [dict(r) for r in rows]

        question = "还记得 Pelican 发布 计划 和 预算 吗"
        for who in (ALICE_P2P, ALICE_OTHER_GROUP, BOB_P2P):
            prompt = _prompt(h, await _ask(h, question, **who))
            assert "Sandpiper" not in prompt, (who, prompt[-1200:])
        # The control: in its own group the episode is recalled.
        prompt = _prompt(h, await _ask(h, question, **ALICE_GROUP))
        assert "Sandpiper" in prompt, prompt[-1500:]
        # ... and the p2p episode is not recalled in the group, but is in p2p.
        assert "私下讨论了 Kestrel" not in _prompt(h, await _ask(h, "还记得 Kestrel 收购 计划 吗", **ALICE_GROUP))
        assert "私下讨论了 Kestrel" in _prompt(h, await _ask(h, "还记得 Kestrel 收购 计划 吗", **ALICE_P2P))

        # /episodes (list and search) follows the same rule.
        async def episodes_answer(command: str, who: dict) -> str:
            before = len(h.lark.messages())
            await h.send_text(command, **who)
            msgs = await h.replies(before + 1)
            return msgs[-1].text

        for who in (ALICE_P2P, ALICE_OTHER_GROUP):
            for command in ("/episodes", "/episodes Pelican"):
                text = await episodes_answer(command, who)
                assert "Sandpiper" not in text and "Pelican 预算" not in text, (who, command, text)
        assert "Sandpiper" in await episodes_answer("/episodes", ALICE_GROUP)
        assert "Sandpiper" in await episodes_answer("/episodes Pelican", ALICE_GROUP)
        assert "Kestrel" in await episodes_answer("/episodes", ALICE_P2P)
