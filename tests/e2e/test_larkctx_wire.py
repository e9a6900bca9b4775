"""Issue 25 at the wire: ``ethan serve`` as a subprocess behind the fake Lark (signed,
encrypted webhooks), on both model adapters (the real ``anthropic`` and ``openai`` clients
against their fakes). What the model was asked is read back from the model fake; what reached
Lark from the Lark fake."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import time

import aiohttp
import pytest
from PIL import Image

from tests.fakes.fake_anthropic import Delay, FakeAnthropic, Text
from tests.fakes.fake_lark import FakeLark
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_stt import ogg_opus
from tests.harness import ENCRYPT_KEY, VERIFICATION_TOKEN
from tests.fakes.lark_events import (_envelope, make_audio_event, make_card_action_event, make_recalled_event,
                                     make_text_event,
                                     webhook_request)
from tests.reliability.support import ServerProcess, post_event, sqlite_rows, wait_until

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


@pytest.fixture
def lark():
    fake = FakeLark(users={"ou_alice": "Alice", "ou_bob": "Bob", "ou_carol": "Carol",
                           "ou_dave": "Dave"}).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(params=["anthropic", "openai"])
def model(request):
    fake = (FakeOpenAI() if request.param == "openai" else FakeAnthropic()).start()
    fake.on_tool("write_summary", lambda req: {"summary": "(summary)"}, keys={"summary"})
    fake.on_tool("extract_memories", lambda req: {"facts": [], "profile_psych": []},
                 keys={"facts", "profile_psych"})
    try:
        yield fake
    finally:
        fake.stop()


def _server(home, lark, model, **env) -> ServerProcess:
    if isinstance(model, FakeOpenAI):
        env = dict(OPENAI_API_KEY="x", OPENAI_BASE_URL=model.base_url, ETHAN_PROVIDER="openai",
                   ETHAN_MODEL="gpt-4o", ANTHROPIC_API_KEY="", ANTHROPIC_BASE_URL="", **env)
    return ServerProcess(home, lark, model, **env)


@pytest.fixture
async def serve(tmp_path, lark, model, stt):
    # Speech to text at its own (fake) server: ETHAN_STT_* (bot/media/stt.py)
    srv = _server(tmp_path / "home", lark, model, ETHAN_STT_MODEL="whisper-1",
                  ETHAN_STT_BASE_URL=stt.base_url, ETHAN_STT_API_KEY="sk-stt", ETHAN_STT_MAX_SECONDS="60")
    await srv.start_ready()
    try:
        yield srv
    finally:
        srv.close()


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (20, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


async def _ask(srv, lark, model, event, n: int = 1):
    lark.register_inbound(event)
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, srv.url, event) == 200
    await lark.wait_for_messages_async(n, timeout=20)
    await wait_until(lambda: len(model.chat_requests()) >= 1, 10, "the model was asked")
    return model.chat_requests()[-1]


def _request_text(req) -> str:
    """Every text block of the last user message (context, material and the user's words)."""
    last = [m for m in req.json["messages"] if m["role"] == "user"][-1]
    content = last["content"]
    return content if isinstance(content, str) else "\n".join(
        b.get("text", "") for b in content if b.get("type") == "text")


def _image_urls(req) -> list[str]:
    """Image blocks of the last user message as each API carries them (base64 data)."""
    if getattr(req, "wire", None):
        last = [m for m in req.wire["messages"] if m["role"] == "user"][-1]
        return [p["image_url"]["url"].split(",", 1)[1] for p in last["content"]
                if isinstance(last["content"], list) and p.get("type") == "image_url"]
    last = [m for m in req.json["messages"] if m["role"] == "user"][-1]
    return [b["source"]["data"] for b in (last["content"] if isinstance(last["content"], list) else [])
            if b.get("type") == "image"]


# -- the quoted message ---------------------------------------------------------------------

async def test_reply_to_a_text_puts_the_quote_with_its_sender_in_the_request(serve, lark, model):
    lark.add_message("om_parent_text", "oc_p2p_alice", text="下周三上线，别忘了备份数据库", sender="ou_bob",
                     create_ms=1764468000000)
    model.script(Text("Bob 说下周三上线前要备份数据库。"))
    req = await _ask(serve, lark, model, make_text_event("总结一下这条", parent_id="om_parent_text", **ALICE))
    text = _request_text(req)
    assert "总结一下这条" in text
    assert ('<untrusted_content kind="quoted" source="om_parent_text" author="Bob" '
            'time="2025-11-30T02:00:00+00:00">下周三上线，别忘了备份数据库</untrusted_content>') in text
    assert lark.calls_to("/open-apis/im/v1/messages/om_parent_text", "GET")
    # Data for this request only: the stored history keeps the user's own words.
    stored = [r["content"] for r in sqlite_rows(serve.db_path, "SELECT content FROM messages WHERE role = 'user'")]
    assert stored == ["总结一下这条"]


async def test_reply_to_a_post_reads_its_markdown(serve, lark, model):
    post = {"title": "发布计划", "content": [[{"tag": "text", "text": "第一步 <b>冻结</b>"}]],
            "content_v2": "## 发布计划\n```python\nprint('freeze')\n```"}
    lark.add_message("om_parent_post", "oc_p2p_alice", msg_type="post", content=post)
    model.script(Text("好的。"))
    req = await _ask(serve, lark, model, make_text_event("这个计划靠谱吗", parent_id="om_parent_post", **ALICE))
    text = _request_text(req)
    assert "## 发布计划\n```python\nprint('freeze')\n```" in text, text
    assert "<b>" not in text      # the old flattening (and tags) not used when content_v2 is there


async def test_reply_to_an_image_sends_the_image_block(serve, lark, model):
    img = png(40, 30)
    lark.add_message("om_parent_img", "oc_p2p_alice", msg_type="image", content={"image_key": "img_v3_q"})
    lark.add_resource("om_parent_img", "img_v3_q", img, "image/png")
    model.script(Text("一张蓝色的图。"))
    req = await _ask(serve, lark, model, make_text_event("图里是什么", parent_id="om_parent_img", **ALICE))
    assert _image_urls(req) == [base64.b64encode(img).decode()]
    assert "img_v3_q" in _request_text(req)


async def test_reply_to_a_merged_forward_reads_its_children(serve, lark, model):
    lark.add_forward("om_parent_fwd", "oc_p2p_alice", [
        {"sender": "ou_bob", "text": "周五团建去爬山", "create_ms": 1764468000000},
        {"sender": "ou_carol", "text": "我带水", "create_ms": 1764468060000},
    ])
    model.script(Text("周五去爬山，Carol 带水。"))
    req = await _ask(serve, lark, model, make_text_event("他们定了什么", parent_id="om_parent_fwd", **ALICE))
    text = _request_text(req)
    assert "Bob: 周五团建去爬山" in text and "Carol: 我带水" in text


@pytest.mark.parametrize("why", ["recalled", "forbidden", "unknown"])
async def test_an_unreadable_quote_is_answered_anyway_with_a_note(serve, lark, model, why):
    if why == "recalled":
        lark.add_message("om_gone", "oc_p2p_alice", text="秘密")
        lark.recall_message("om_gone")
    elif why == "forbidden":
        lark.add_message("om_gone", "oc_p2p_alice", text="秘密")
        lark.deny_message("om_gone")
    model.script(Text("那条消息我读不到。"))
    req = await _ask(serve, lark, model, make_text_event("这条说的啥", parent_id="om_gone", **ALICE))
    text = _request_text(req)
    assert "could not be read" in text and "秘密" not in text
    [sent] = lark.messages(chat_id="oc_p2p_alice")
    assert "读不到" in sent.text
    assert any(e.get("event") == "quote.unreadable" for e in serve.entries())


async def test_a_quote_from_another_chat_does_not_reach_the_model(serve, lark, model):
    """Issue 45 N12: the bot's token reads every chat it is in; a ``parent_id`` naming another
    chat's message (one the replying user need not be in) is not shown, only a short note."""
    lark.add_message("om_hr_only", "oc_hr_private", text="工资表：张三 58000", sender="ou_bob")
    model.script(Text("那条消息我读不到。"))
    req = await _ask(serve, lark, model, make_text_event("这条说的啥", parent_id="om_hr_only", **ALICE))
    raw = json.dumps(req.json, ensure_ascii=False)
    assert "58000" not in raw and "工资表" not in raw
    assert "could not be read" in _request_text(req)
    [line] = [e for e in serve.entries() if e.get("event") == "quote.foreign_chat"]
    assert (line["chat_id"], line["parent_id"], line["quoted_chat_id"]) == ("oc_p2p_alice", "om_hr_only",
                                                                            "oc_hr_private")


# -- Lark's rules on the way out ---------------------------------------------------------------

GROUP = dict(chat_type="group", mentions=["ou_bot"])


async def test_a_model_written_mention_reaches_lark_escaped(serve, lark, model):
    model.script(Text('<at user_id="all"></at> 大家注意'),
                 Text('## 通知\n- <at id=all></at> 开会\n- <AT ids="ou_bob"></at> 带电脑'))
    await _ask(serve, lark, model, make_text_event("帮我叫一下所有人", chat_id="oc_team_at", **GROUP))
    await _ask(serve, lark, model, make_text_event("用列表再发一遍", chat_id="oc_team_at", **GROUP), n=2)
    sent = lark.messages(chat_id="oc_team_at")
    assert [m.msg_type for m in sent] == ["text", "post"]
    raw = json.dumps([m.content for m in sent], ensure_ascii=False)
    assert "<at" not in raw.lower() and "</at" not in raw.lower(), raw
    assert '＜at user_id="all">＜/at> 大家注意' == sent[0].text


async def test_a_v1_event_gets_200_and_one_log_line(serve, lark, model):
    body = {"uuid": "v1-uuid-1", "token": "vtoken", "ts": "1764468000.0", "type": "event_callback",
            "event": {"type": "message", "app_id": "cli_test", "open_chat_id": "oc_x", "text": "hi"}}
    headers, data = webhook_request(body, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
    async with aiohttp.ClientSession() as http:
        async with http.post(serve.url + "/lark/events", data=data, headers=headers) as r:
            assert r.status == 200
    await wait_until(lambda: any(e.get("event") == "webhook.v1_event_ignored" for e in serve.entries()),
                     5, "the v1 log line")
    assert [e["event_type"] for e in serve.entries() if e.get("event") == "webhook.v1_event_ignored"] == ["message"]
    assert model.chat_requests() == [] and lark.messages() == []


async def test_a_disbanded_chat_is_left(serve, lark, model):
    ev = _envelope("im.chat.disbanded_v1", {"chat_id": "oc_team_gone", "operator_id": {"open_id": "ou_alice"},
                                            "external": False, "operator_tenant_key": "tk_demo", "name": "Team"})
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, ev) == 200
        await wait_until(lambda: any(e.get("event") == "chat.left" for e in serve.entries()), 10, "chat.left")
        late = make_text_event("还在吗", chat_id="oc_team_gone", **GROUP)
        assert await post_event(http, serve.url, late) == 200
    mid = late["event"]["message"]["message_id"]
    rows = await wait_until(lambda: [r for r in sqlite_rows(serve.db_path, "SELECT status, note FROM inbox"
                                                            " WHERE message_id = ?", (mid,))
                                     if r["status"] != "pending"], 10, "the late message finished")
    assert [(r["status"], r["note"]) for r in rows] == [("ignored", "bot removed from the chat")]
    assert lark.messages() == [] and model.chat_requests() == []


async def test_a_topic_group_keeps_one_session_per_topic(serve, lark, model):
    lark.chat_modes["oc_topics"] = "topic"
    topic = dict(chat_id="oc_topics", **GROUP)
    a = make_text_event("话题 A：部署", **topic)
    b = make_text_event("话题 B：招聘", **topic)
    a_id, b_id = a["event"]["message"]["message_id"], b["event"]["message"]["message_id"]
    await asyncio.sleep(1.1)     # Ethan's answer in topic A comes after B's first message was sent
    await _ask(serve, lark, model, a, n=1)
    req_b = await _ask(serve, lark, model, b, n=2)
    assert "部署" not in _request_text(req_b)          # topic A is not topic B's discussion
    await _ask(serve, lark, model, make_text_event("A 的后续", root_id=a_id, parent_id=a_id, **topic), n=3)
    await _ask(serve, lark, model, make_text_event("B 的后续", root_id=b_id, parent_id=b_id, **topic), n=4)
    last = model.last_user_text(model.chat_requests()[-1])
    assert "B 的后续" in last
    history = json.dumps(model.chat_requests()[-1].json["messages"], ensure_ascii=False)
    assert "话题 B：招聘" in history and "部署" not in history      # topic A is another conversation
    rows = sqlite_rows(serve.db_path, "SELECT conv_key, thread_id FROM sessions ORDER BY conv_key")
    assert sorted(r["thread_id"] for r in rows) == sorted([a_id, b_id]), [dict(r) for r in rows]


# -- the group's discussion -------------------------------------------------------------------

DISCUSSION = [("ou_alice", "周五的发布要不要推迟？"), ("ou_bob", "我觉得推迟到下周一"),
              ("ou_carol", "测试还没跑完，同意推迟"), ("ou_alice", "那数据库迁移呢"),
              ("ou_bob", "迁移脚本我周日再检查一遍")]


async def _discuss(serve, lark, chat: str, said=DISCUSSION, *, ago_s: float = 600) -> None:
    """Members talk without @-mentioning Ethan (Lark delivers these only with
    im:message.group_msg; Ethan ignores them either way)."""
    t0 = int((time.time() - ago_s) * 1000)
    async with aiohttp.ClientSession() as http:
        for i, (who, text) in enumerate(said):
            if ago_s:
                at = t0 + i * 1000
            else:
                # Said now: each after whatever came before it (Ethan's last answer included)
                # and before the question that follows — a time made up ahead of the clock
                # could land after the question, in the next second its end_time leaves out.
                await asyncio.sleep(0.005)
                at = int(time.time() * 1000)
            ev = make_text_event(text, chat_id=chat, chat_type="group", sender=who, create_time_ms=at)
            lark.register_inbound(ev)
            assert await post_event(http, serve.url, ev) == 200


async def test_an_at_in_a_group_sees_the_discussion_with_names_never_stored(serve, lark, model):
    await _discuss(serve, lark, "oc_team_talk")
    model.script(Text("大家倾向于推迟到下周一，Bob 周日检查迁移脚本。"))
    req = await _ask(serve, lark, model, make_text_event("总结一下上面的讨论", chat_id="oc_team_talk",
                                                         sender="ou_dave", **GROUP))
    text = _request_text(req)
    # one fence per message, in the one form of all material: who wrote it, where, when
    said = re.findall(r'<untrusted_content kind="group" source="om_[^"]+" author="([^"]+)" '
                      r'time="\d{4}-\d\d-\d\dT[^"]+">([^<]*)</untrusted_content>', text)
    assert said == [(lark.users[w], t) for w, t in DISCUSSION], text
    assert "总结一下上面的讨论" in model.last_user_text(req)
    # Other members' words are context for this answer: not in the history consolidation
    # reads, so never the asker's facts or profile.
    stored = [r["content"] for r in sqlite_rows(serve.db_path, "SELECT content FROM messages")]
    assert not any(t in c for c in stored for _, t in DISCUSSION), stored
    assert not any(t in json.dumps(r.json, ensure_ascii=False) for r in model.requests
                   if r not in model.chat_requests() for _, t in DISCUSSION)


async def test_the_discussion_starts_after_ethans_last_answer(serve, lark, model):
    await _discuss(serve, lark, "oc_team_again", DISCUSSION[:2])
    model.script(Text("第一次回答。"), Text("第二次回答。"))
    await _ask(serve, lark, model, make_text_event("怎么看", chat_id="oc_team_again", sender="ou_dave", **GROUP))
    await _discuss(serve, lark, "oc_team_again", DISCUSSION[2:], ago_s=0)
    req = await _ask(serve, lark, model, make_text_event("现在呢", chat_id="oc_team_again",
                                                         sender="ou_dave", **GROUP), n=2)
    text = _request_text(req)
    assert all(t in text for _, t in DISCUSSION[2:]) and not any(t in text for _, t in DISCUSSION[:2]), text
    lark_budget = [e for e in serve.entries() if e.get("event") == "group_context.read"]
    assert [e["messages"] for e in lark_budget] == [2, 3]


async def test_without_the_scope_one_log_line_and_the_at_message_alone(serve, lark, model):
    lark.deny_message("oc_team_noscope", 99991672)
    await _discuss(serve, lark, "oc_team_noscope")
    model.script(Text("好的。"), Text("好的。"))
    req = await _ask(serve, lark, model, make_text_event("总结一下", chat_id="oc_team_noscope",
                                                         sender="ou_dave", **GROUP))
    await _ask(serve, lark, model, make_text_event("再总结一下", chat_id="oc_team_noscope",
                                                   sender="ou_dave", **GROUP), n=2)
    assert "untrusted_content" not in _request_text(req)
    lines = [e for e in serve.entries() if e.get("event") == "group_context.unavailable"]
    assert len(lines) == 1 and "im:message.group_msg" in lines[0]["missing_scope"]


async def test_a_card_click_with_a_string_value_is_ignored_quietly(serve, lark, model):
    ev = make_card_action_event("{\"action\": \"approve\"}", chat_id="oc_p2p_alice", message_id="om_foreign_card")
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, ev) == 200
    rows = await wait_until(lambda: [r for r in sqlite_rows(serve.db_path, "SELECT status, note FROM inbox")
                                     if r["status"] != "pending"], 10, "the click finished")
    assert [(r["status"], r["note"]) for r in rows] == [("ignored", "not an Ethan button")]
    assert not [e for e in serve.entries() if e.get("level") in ("warning", "error")]
    assert lark.messages() == [] and model.chat_requests() == []


async def test_a_direct_chat_knows_the_users_name(serve, lark, model):
    model.script(Text("你好 Alice。"), Text("还是你。"))
    req = await _ask(serve, lark, model, make_text_event("你知道我是谁吗", **ALICE))
    assert "you are talking with: Alice]" in _request_text(req)
    await _ask(serve, lark, model, make_text_event("再问一次", **ALICE), n=2)
    assert len(lark.calls_to("/open-apis/contact/v3/users/ou_alice", "GET")) == 1     # cached


# -- a recall while Ethan is answering ---------------------------------------------------------

async def _recall(serve, mid: str, chat_id: str) -> None:
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, make_recalled_event(mid, chat_id=chat_id)) == 200
    await wait_until(lambda: any(e.get("event") == "message.recalled" and e.get("message_id") == mid
                                 for e in serve.entries()), 15, "the recall was handled")


async def test_a_recall_one_second_into_a_five_second_answer_sends_nothing(serve, lark, model):
    model.script(Delay(5, Text("收到，你的密码 hunter2 我记下了。")), Text("你好！"))
    ev = make_text_event("我的密码是 hunter2", **ALICE)
    mid = ev["event"]["message"]["message_id"]
    lark.register_inbound(ev)
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, ev) == 200
    await wait_until(lambda: len(model.chat_requests()) >= 1, 10, "the model was asked")
    await asyncio.sleep(1)
    lark.recall_message(mid)
    await _recall(serve, mid, ALICE["chat_id"])
    # The next message is answered at once, not behind the recalled one's 5 s answer.
    req = await _ask(serve, lark, model, make_text_event("你好", **ALICE))
    assert [m.text for m in lark.messages()] == ["你好！"]
    assert not any(m.reply_to == mid for m in lark.messages())
    assert "hunter2" not in json.dumps(req.json, ensure_ascii=False)
    stored = [r["content"] for r in sqlite_rows(serve.db_path, "SELECT content FROM messages")]
    assert not any("hunter2" in c for c in stored), stored
    [row] = sqlite_rows(serve.db_path, "SELECT status, note FROM inbox WHERE dedup_key = ?", (f"msg:{mid}",))
    assert (row["status"], row["note"]) == ("ignored", "recalled")
    assert [e["withdrawn"] for e in serve.entries() if e.get("event") == "reply.stopped_by_recall"] == [0]


async def test_a_recall_mid_stream_deletes_the_half_streamed_card(serve, lark, model):
    model.stream_chunks, model.stream_delay = 8, 0.7      # ~5 s of deltas: a streaming card
    model.script(Text("第一段：机密计划的细节。" * 12), Text("好的。"))
    ev = make_text_event("把机密计划写出来", **ALICE)
    mid = ev["event"]["message"]["message_id"]
    lark.register_inbound(ev)
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, ev) == 200
    [card] = await lark.wait_for_messages_async(1, timeout=15)
    assert card.msg_type == "interactive"
    lark.recall_message(mid)
    await _recall(serve, mid, ALICE["chat_id"])
    assert lark.calls_to(f"/open-apis/im/v1/messages/{card.message_id}", "DELETE")
    assert [m.message_id for m in lark.messages()] == [card.message_id]    # nothing after it
    assert lark.message(card.message_id).recalled
    stored = [r["content"] for r in sqlite_rows(serve.db_path, "SELECT content FROM messages")]
    assert not any("机密计划" in c for c in stored), stored
    model.stream_delay = 0
    await _ask(serve, lark, model, make_text_event("你好", **ALICE), n=2)
    assert "机密计划" not in json.dumps(model.chat_requests()[-1].json, ensure_ascii=False)


# -- voice messages --------------------------------------------------------------------------

def _voice(lark, audio: bytes, *, duration_ms: int = 3000, **kw) -> dict:
    ev = make_audio_event("file_v3_voice", duration_ms=duration_ms, **{**ALICE, **kw})
    lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_voice", audio, "audio/ogg")
    return ev


async def test_a_voice_message_is_answered_from_its_transcript(serve, lark, model, stt):
    audio = ogg_opus(3.2, tag=b"meeting")
    stt.add(audio, "明天下午三点提醒我开周会")
    model.script(Text("好的，明天下午三点提醒你开周会。"))
    req = await _ask(serve, lark, model, _voice(lark, audio))
    assert "明天下午三点提醒我开周会" in model.last_user_text(req)          # as if typed
    [heard] = stt.requests
    assert (heard.model, heard.filename, heard.content_type) == ("whisper-1", "voice.ogg", "audio/ogg")
    assert heard.data == audio and heard.authorization == "Bearer sk-stt"
    [sent] = lark.messages()
    assert sent.text.startswith("🎤 「明天下午三点提醒我开周会」"), sent.text    # what was heard, shown
    assert sent.text.endswith("好的，明天下午三点提醒你开周会。")
    stored = [(r["role"], r["content"]) for r in sqlite_rows(serve.db_path, "SELECT role, content FROM messages ORDER BY id")]
    assert stored == [("user", "明天下午三点提醒我开周会"), ("assistant", "好的，明天下午三点提醒你开周会。")]
    [line] = [e for e in serve.entries() if e.get("event") == "voice.transcribed"]
    assert line["seconds"] == 3.2 and line["chars"] == len("明天下午三点提醒我开周会")


@pytest.mark.parametrize("case", ["declared_too_long", "measured_too_long", "undecodable", "silence", "stt_down"])
async def test_voice_that_cannot_be_heard_gets_a_short_answer_and_nothing_is_stored(serve, lark, model, stt, case):
    audio, duration_ms, expect = ogg_opus(2, tag=case.encode()), 2000, "听"
    if case == "declared_too_long":
        duration_ms, expect = 90_000, "太长"
    elif case == "measured_too_long":
        audio, expect = ogg_opus(75, tag=b"long"), "太长"           # Lark's event says 2 s
    elif case == "undecodable":
        audio, expect = b"\x00\x01not audio at all" * 40, "读不了"
    elif case == "stt_down":
        stt.fail_next(503)
        expect = "语音识别服务暂时不可用"
    else:
        stt.add(audio, "")                                         # the server heard no words
        expect = "没听出"
    ev = _voice(lark, audio, duration_ms=duration_ms)
    lark.register_inbound(ev)
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, serve.url, ev) == 200
    [sent] = await lark.wait_for_messages_async(1, timeout=20)
    assert expect in sent.text and len(sent.text) < 80, sent.text
    assert model.chat_requests() == []
    assert sqlite_rows(serve.db_path, "SELECT id FROM messages") == []
    heard = {"declared_too_long": 0, "measured_too_long": 0, "undecodable": 0}.get(case, 1)
    assert len(stt.requests) == heard
    [refused] = [e for e in serve.entries() if e.get("event") == "attachment.refused"]
    assert refused["message_id"] == ev["event"]["message"]["message_id"]


async def test_without_speech_to_text_a_voice_message_gets_the_polite_answer(tmp_path, lark, model, stt):
    srv = _server(tmp_path / "home", lark, model)
    await srv.start_ready()
    try:
        await _ask_no_model(srv, lark, _voice(lark, ogg_opus(2, tag=b"x")))
        [sent] = lark.messages()
        assert sent.text == "抱歉，我暂时还看不懂语音，可以用文字告诉我吗？"
        assert stt.requests == [] and model.chat_requests() == []
    finally:
        srv.close()


async def _ask_no_model(srv, lark, event, n: int = 1):
    lark.register_inbound(event)
    async with aiohttp.ClientSession() as http:
        assert await post_event(http, srv.url, event) == 200
    return await lark.wait_for_messages_async(n, timeout=20)


# -- gaps: the group-context budget, mentions on the streamed-card path ----------------------

async def test_the_group_context_keeps_the_newest_messages_within_the_token_budget(tmp_path, lark, model):
    from memory.text.tokens import estimate_tokens

    said = [(w, f"第{i}条：" + "关于发布计划的详细讨论内容，" * 4) for i, w in
            enumerate(["ou_alice", "ou_bob", "ou_carol", "ou_alice", "ou_bob"], 1)]
    cost = [estimate_tokens(t) + estimate_tokens(lark.users[w]) + 8 for w, t in said]
    budget = cost[-1] + cost[-2] + cost[-3] // 2          # the newest two fit, the third does not
    srv = _server(tmp_path / "home", lark, model, ETHAN_GROUP_CONTEXT_TOKENS=str(budget))
    await srv.start_ready()
    try:
        await _discuss(srv, lark, "oc_team_budget", said)
        model.script(Text("好的。"))
        req = await _ask(srv, lark, model, make_text_event("总结一下", chat_id="oc_team_budget",
                                                           sender="ou_dave", **GROUP))
        text = _request_text(req)
        assert [t for _, t in said if t in text] == [said[3][1], said[4][1]], text
        assert text.index(said[3][1]) < text.index(said[4][1])          # in the order said
        [line] = [e for e in srv.entries() if e.get("event") == "group_context.read"]
        assert line["messages"] == 2 and line["tokens"] <= budget
    finally:
        srv.close()


async def test_a_model_written_mention_in_a_streamed_card_reaches_lark_escaped(serve, lark, model):
    long = '<at user_id="all"></at> 大家注意：' + "这是一段很长的通知内容。" * 80 + ' <at id=all></at>'
    model.script(Text(long))
    await _ask(serve, lark, model, make_text_event("写一份长通知", chat_id="oc_team_card", **GROUP))
    [sent] = lark.messages(chat_id="oc_team_card")
    assert sent.msg_type == "interactive"                   # streamed into a CardKit card
    [card] = lark.cards()
    final = lark.card_text(card.card_id)
    assert final.startswith('＜at user_id="all">＜/at> 大家注意'), final[:80]
    pushed = [c for c in lark.calls if "/cardkit/" in c.path or "/im/v1/messages" in c.path]
    raw = "\n".join(c.body.decode("utf-8", "replace") for c in pushed)
    assert "大家注意" in raw and "<at" not in raw.lower() and "\\u003cat" not in raw.lower()


# -- polite replies in the user's language; posts in the user's locale ------------------------

async def test_polite_replies_follow_the_users_language_and_posts_carry_their_locale(tmp_path, lark, model, stt):
    srv = _server(tmp_path / "home", lark, model)          # no speech to text configured
    await srv.start_ready()
    bob = dict(chat_id="oc_p2p_bob", sender="ou_bob")
    try:
        model.script(Text("Here you go:\n\n- Start early\n- Bring water"), Text("好的：\n\n- 早点出发\n- 带水"))
        await _ask(srv, lark, model, make_text_event("Could you list two hiking tips?", **ALICE))
        await _ask(srv, lark, model, make_text_event("列两条徒步建议", **bob), n=2)
        sticker = dict(message_type="sticker", content={"file_key": "v3_sticker"})
        await _ask_no_model(srv, lark, _voice(lark, ogg_opus(2, tag=b"en")), n=3)
        await _ask_no_model(srv, lark, make_text_event("", **ALICE, **sticker), n=4)
        await _ask_no_model(srv, lark, make_text_event("", **bob, **sticker), n=5)
        alice, bobs = lark.messages(chat_id=ALICE["chat_id"]), lark.messages(chat_id=bob["chat_id"])
        assert [m.msg_type for m in alice] == ["post", "text", "text"]
        assert list(alice[0].content) == ["en_us"] and list(bobs[0].content) == ["zh_cn"]
        assert [m.text for m in alice[1:]] == ["Sorry, I can't read voice messages yet — could you tell me in text?",
                                               "Sorry, I can't read stickers yet — could you tell me in text?"]
        assert bobs[1].text == "抱歉，我暂时还看不懂表情包，可以用文字告诉我吗？"
        # A card's buttons carry both locales: Lark shows the reader's (i18n_content).
        await _ask_no_model(srv, lark, make_text_event("/forget all", **ALICE), n=6)
        card = lark.messages(chat_id=ALICE["chat_id"])[-1]
        texts = [b["text"] for b in _walk(card.content) if isinstance(b, dict) and b.get("tag") == "button"]
        assert [t["i18n_content"] for t in texts] == [{"zh_cn": "确认删除", "en_us": "Confirm"},
                                                      {"zh_cn": "取消", "en_us": "Cancel"}]
        assert "Delete" in card.text or "delete" in card.text, card.text    # the question in English
    finally:
        srv.close()


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for c in children:
        yield from _walk(c)
