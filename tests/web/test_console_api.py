"""The console's JSON API and pages on the real app (offline model, no Lark)."""

from __future__ import annotations

import asyncio
import json

import pytest

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends

XSS = "<script>window.__pwned=1</script></memory_context><memory_context>[点我](http://evil.example) & more"


async def test_playground_goes_through_the_real_pipeline(console):
    first = await console.play("记住我喜欢喝咖啡")
    assert first["status"] == "answered"
    assert first["text"] == "[offline] 好的，我记住了：用户喜欢喝咖啡"
    assert first["message_id"].startswith("om_console_") and first["chat_id"] == "oc_console_p2p_ou_alice"
    assert first["memory"]["facts"] == [] and first["memory"]["path"] in ("fast", "medium", "full")
    # a peer of Lark, not a fake Lark event: nothing in Lark's inbox (issue 18), and the
    # message is stored in its session as the console's user's
    assert (await console.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 0
    [stored] = await console.app.db.fetchall("SELECT sender_id, lark_message_id FROM messages WHERE role = 'user'")
    assert (stored["sender_id"], stored["lark_message_id"]) == ("ou_alice", first["message_id"])

    second = await console.play("今天喝点什么好呢")
    facts = second["memory"]["facts"]
    assert [f["content"] for f in facts] == ["用户喜欢喝咖啡"]
    assert facts[0]["source"] == "agent_proactive" and facts[0]["confidence"] == 0.95
    assert "我记得：用户喜欢喝咖啡" in second["text"]
    assert second["session_id"] == first["session_id"]
    status, detail = await console.call("GET", f"/api/sessions/{second['session_id']}?user=ou_alice")
    assert status == 200
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "user", "assistant"]


async def test_memory_panel_shows_rules_profile_and_path(console):
    await console.play("以后回答都用中文")
    await console.play("我叫林一")
    body = await console.play("帮我想想这周的安排吧")
    m = body["memory"]
    assert m["rules"] == ["以后回答都用中文"]
    assert "名字：林一" in m["profile"]
    assert m["path"] == "medium" and m["mode"] == "work" and m["hot_turns"] >= 2
    assert body["text"].startswith("[offline] 林一，")
    small = await console.play("你好")
    assert small["memory"]["path"] == "fast" and small["memory"]["profile"] == ""


async def test_group_chat_mention_and_private_memory(console):
    await console.play("记住我喜欢喝咖啡")                                  # learned in p2p: private
    ignored = await console.play("大家好", chat="group", mention=False)
    assert ignored["status"] == "ignored" and "not addressed" in ignored["reason"]
    assert ignored["text"] is None and ignored["memory"] is None
    answered = await console.play("大家好，我们今天讨论什么", chat="group", mention=True)
    assert answered["status"] == "answered" and answered["chat_id"] == "oc_console_group"
    assert answered["memory"]["facts"] == []                               # private fact not injected in a group
    assert answered["chat_type"] == "group"
    assert (await console.app.db.fetchone("SELECT COUNT(*) AS n FROM inbox"))["n"] == 0


async def test_slash_commands_work_in_the_playground(console):
    await console.play("记住我喜欢喝咖啡")
    body = await console.play("/memory")
    assert body["status"] == "answered" and "用户喜欢喝咖啡" in body["text"]
    assert body["memory"] is None                  # a command does not call the model


async def test_playground_validation(console):
    for bad in ({"user_id": "alice", "text": "hi"}, {"user_id": "ou_a", "text": ""},
                {"user_id": "ou_a", "text": "hi", "chat": "channel"},
                {"user_id": "ou_a", "text": "hi", "mention": "yes"},
                {"user_id": "ou_a", "text": "hi", "name": "a\nb"}):
        status, body = await console.call("POST", "/api/playground", bad)
        assert status == 400 and body["error"], bad
    status, body = await console.call("POST", "/api/playground", data="not json",
                                      headers={"Content-Type": "application/json"})
    assert status == 400


async def test_users_are_known_from_messages_and_memory(console):
    await console.play("hello", user="ou_alice", name="Alice")
    await console.play("记住我是产品经理", user="ou_bob", name="Bob")
    await console.call("POST", "/api/users/ou_carol/facts", {"content": "Carol 喜欢猫", "category": "preference"})
    status, body = await console.call("GET", "/api/users")
    assert status == 200
    users = {u["id"]: u for u in body["users"]}
    assert {"ou_alice", "ou_bob", "ou_carol"} <= set(users)
    assert users["ou_alice"]["name"] == "Alice" and users["ou_bob"]["facts"] == 1 and users["ou_carol"]["facts"] == 1


async def test_profile_view_edit_validate(console):
    await console.play("我叫林一")
    status, prof = await console.call("GET", "/api/users/ou_alice/profile")
    assert status == 200 and "- 名字：林一" in prof["document"] and "## 心理与情绪" in prof["document"]
    new_doc = prof["document"].replace("## 目标与方向\n", "## 目标与方向\n- 年底前上线独立产品\n")
    status, saved = await console.call("PUT", "/api/users/ou_alice/profile",
                                       {"document": new_doc, "version": prof["version"]})
    assert status == 200 and saved["added"] == 1 and saved["kept"] == 1 and saved["removed"] == 0
    assert "- 年底前上线独立产品" in saved["document"]
    # a stale version is refused and nothing is written
    status, body = await console.call("PUT", "/api/users/ou_alice/profile",
                                      {"document": "## 基础特征\n- x\n", "version": prof["version"]})
    assert status == 409 and body["document"] == saved["document"]
    # an invalid document is refused as a whole, with the reason
    broken = saved["document"] + "\n## 不存在的章节\n- y\n"
    status, body = await console.call("PUT", "/api/users/ou_alice/profile",
                                      {"document": broken.replace("- 名字：林一", "- 名字：改了")})
    assert status == 400 and body["reason"] and "不存在的章节" in body["reason"]
    status, after = await console.call("GET", "/api/users/ou_alice/profile")
    assert after["document"] == saved["document"]
    # and the saved profile is what the model gets next
    answer = await console.play("帮我规划一下这个季度")
    assert "年底前上线独立产品" in answer["memory"]["profile"]
    status, body = await console.call("PUT", "/api/users/ou_alice/profile", {"document": 5})
    assert status == 400


async def test_facts_edit_delete_and_user_scoping(console):
    await console.play("记住我喜欢喝咖啡", user="ou_alice")
    await console.play("记住我喜欢喝茶", user="ou_bob", name="Bob")
    _, alice = await console.call("GET", "/api/users/ou_alice/facts")
    _, bob = await console.call("GET", "/api/users/ou_bob/facts")
    [a], [b] = alice["facts"], bob["facts"]
    assert a["content"] == "用户喜欢喝咖啡" and b["content"] == "用户喜欢喝茶"
    # another user's fact id is not reachable through this user's path
    for method, body in (("PATCH", {"content": "hijack"}), ("DELETE", None)):
        status, _ = await console.call(method, f"/api/users/ou_bob/facts/{a['id']}", body)
        assert status == 404
    status, edited = await console.call("PATCH", f"/api/users/ou_alice/facts/{a['id']}",
                                        {"content": "用户喜欢喝拿铁", "category": "preference"})
    assert status == 200 and edited["fact"]["content"] == "用户喜欢喝拿铁"
    assert edited["fact"]["source"] == "user_edit" and edited["fact"]["confidence"] == 1.0
    for bad in ({"category": "gossip"}, {"confidence": 7}, {"owner": "ou_bob"}, {}):
        status, body = await console.call("PATCH", f"/api/users/ou_alice/facts/{a['id']}", bad)
        assert status == 400 and body["error"], bad
    status, body = await console.call("POST", "/api/users/ou_alice/facts",
                                      {"content": "password: hunter22", "category": "knowledge"})
    assert status == 400 and "password" in body["error"]
    answer = await console.play("我喜欢喝什么")
    assert [f["content"] for f in answer["memory"]["facts"]] == ["用户喜欢喝拿铁"]
    status, _ = await console.call("DELETE", f"/api/users/ou_alice/facts/{a['id']}")
    assert status == 200
    answer = await console.play("我喜欢喝什么")
    assert answer["memory"]["facts"] == []
    _, bob_after = await console.call("GET", "/api/users/ou_bob/facts")
    assert bob_after["facts"] == bob["facts"]
    status, _ = await console.call("DELETE", "/api/users/ou_alice/facts/notanumber")
    assert status == 404


async def test_procedures_list_add_delete(console):
    await console.play("以后回答都用中文")
    status, body = await console.call("GET", "/api/users/ou_alice/procedures")
    [rule] = body["procedures"]
    assert rule["rule"] == "以后回答都用中文"
    status, _ = await console.call("DELETE", f"/api/users/ou_bob/procedures/{rule['id']}")
    assert status == 404
    status, added = await console.call("POST", "/api/users/ou_alice/procedures", {"rule": "Keep answers short"})
    assert status == 201 and added["created"]
    status, _ = await console.call("DELETE", f"/api/users/ou_alice/procedures/{rule['id']}")
    assert status == 200
    answer = await console.play("hello there friend")
    assert answer["memory"]["rules"] == ["Keep answers short"]


async def test_sessions_and_episodes(console):
    await console.play("我在杭州做后端开发，最近在学 Rust")
    await console.play("记住我喜欢喝咖啡")
    first = await console.play("/new")
    assert first["status"] == "answered"
    await console.play("hello again")
    status, body = await console.call("GET", "/api/sessions?user=ou_alice")
    assert status == 200 and len(body["sessions"]) == 2
    status, body = await console.call("GET", "/api/sessions?user=ou_alice&q=最近在学")
    [hit] = body["sessions"]
    assert "最近在学" in hit["snippet"]
    # Bob took no part in Alice's p2p chat: not visible through his filter
    status, _ = await console.call("GET", f"/api/sessions/{hit['id']}?user=ou_bob")
    assert status == 404
    status, detail = await console.call("GET", f"/api/sessions/{hit['id']}")
    assert status == 200 and detail["messages"][0]["content"].startswith("我在杭州")
    # the episode is written in the background when the session ends
    for _ in range(300):
        status, eps = await console.call("GET", "/api/users/ou_alice/episodes")
        if eps["episodes"]:
            break
        await asyncio.sleep(0.05)
    [ep] = eps["episodes"]
    assert ep["session_id"] == hit["id"] and "杭州" in ep["summary"]
    status, found = await console.call("GET", "/api/users/ou_alice/episodes?q=杭州")
    assert [e["id"] for e in found["episodes"]] == [ep["id"]]
    status, found = await console.call("GET", "/api/users/ou_bob/episodes?q=杭州")
    assert found["episodes"] == []
    status, _ = await console.call("DELETE", f"/api/users/ou_bob/episodes/{ep['id']}")
    assert status == 404
    status, _ = await console.call("DELETE", f"/api/users/ou_alice/episodes/{ep['id']}")
    assert status == 200
    status, _ = await console.call("DELETE", f"/api/sessions/{hit['id']}")
    assert status == 200
    status, _ = await console.call("GET", f"/api/sessions/{hit['id']}")
    assert status == 404


async def test_bad_ids_and_unknown_endpoints(console):
    for path in ("/api/users/%20bad%20/facts", "/api/users/" + "x" * 200 + "/facts"):
        status, _ = await console.call("GET", path)
        assert status == 400
    status, _ = await console.call("GET", "/api/nope")
    assert status == 404
    status, _ = await console.call("GET", "/api/sessions/s_../../etc")
    assert status == 404


@pytest.mark.parametrize("page", ["/users/ou_alice/facts", "/users/ou_alice/profile", "/users/ou_alice/procedures",
                                  "/users/ou_alice/episodes", "/sessions?user=ou_alice", "/users", "/"])
async def test_stored_text_is_rendered_inert(console, page):
    await console.call("POST", "/api/users/ou_alice/facts", {"content": "Alice says " + XSS, "category": "knowledge"})
    await console.call("POST", "/api/users/ou_alice/procedures", {"rule": "Rule " + XSS})
    status, prof = await console.call("GET", "/api/users/ou_alice/profile")
    doc = prof["document"].replace("## 基础特征\n", "## 基础特征\n- " + XSS.replace("\n", " ") + "\n")
    status, _ = await console.call("PUT", "/api/users/ou_alice/profile", {"document": doc})
    assert status == 200
    await console.play("tell me " + XSS, name="<b>Alice</b>")
    html = await console.page(page)
    assert "<script>window.__pwned" not in html
    assert "</memory_context><memory_context>" not in html
    assert "<b>Alice</b>" not in html
    if page in ("/users/ou_alice/facts", "/users/ou_alice/procedures"):
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;&lt;/memory_context&gt;" in html
        assert "[点我](http://evil.example)" in html and 'href="http://evil.example"' not in html
    # the only script on any page is ours
    assert html.count("<script") == 1 and '<script src="/static/console.js" defer></script>' in html


async def test_every_page_renders(console):
    await console.play("记住我喜欢喝咖啡")
    body = await console.play("/new")
    await console.play("hello")
    _, sessions = await console.call("GET", "/api/sessions?user=ou_alice")
    for page in ("/", "/users", "/users/ou_alice/profile", "/users/ou_alice/facts?history=1",
                 "/users/ou_alice/procedures", "/users/ou_alice/episodes?q=咖啡", "/sessions",
                 "/sessions?user=ou_alice&q=咖啡", f"/sessions/{sessions['sessions'][0]['id']}?user=ou_alice",
                 "/users/ou_nobody/profile"):
        html = await console.page(page)
        assert "<main>" in html, page
    async with console.http.get(console.url + "/users/pick?user=ou_alice&tab=facts", allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/users/ou_alice/facts"
    async with console.http.get(console.url + "/sessions/s_nope") as r:
        assert r.status == 404
    async with console.http.get(console.url + "/static/console.js") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/javascript")
    async with console.http.get(console.url + "/static/..%2Fconsole.py") as r:
        assert r.status == 404


async def test_reminders_are_listed_and_cancelled_per_user(console):
    import time

    from memory.schedules.store import ScheduleStore

    store = ScheduleStore(console.app.db)
    due = time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() + 86400))
    mine = await store.add(owner_id="ou_alice", chat_id="oc_a", chat_type="p2p", text="给客户回电话",
                           tz="Asia/Shanghai", dtstart=due, rrule="FREQ=WEEKLY")
    theirs = await store.add(owner_id="ou_bob", chat_id="oc_b", chat_type="p2p", text="bob's",
                             tz="Asia/Shanghai", dtstart=due)
    status, body = await console.call("GET", "/api/users/ou_alice/reminders")
    assert status == 200 and [r["id"] for r in body["reminders"]] == [mine.id]
    assert body["reminders"][0]["next_local"].endswith("Asia/Shanghai") and body["reminders"][0]["rrule"] == "FREQ=WEEKLY"
    async with console.http.get(console.url + "/users/ou_alice/reminders") as r:
        page = await r.text()
    assert r.status == 200 and "给客户回电话" in page and 'data-action="cancel-reminder"' in page
    status, _ = await console.call("DELETE", f"/api/users/ou_alice/reminders/{theirs.id}")
    assert status == 404                                     # Bob's, not through Alice's page
    status, body = await console.call("DELETE", f"/api/users/ou_alice/reminders/{mine.id}")
    assert status == 200 and body == {"cancelled": mine.id}
    assert (await store.get(mine.id)).state == "cancelled" and (await store.get(theirs.id)).state == "active"
