"""Issue 25 at the wire: ``ethan serve`` as a subprocess behind the fake Lark (signed,
encrypted webhooks), on both model adapters (the real ``anthropic`` and ``openai`` clients
against their fakes). What the model was asked is read back from the model fake; what reached
Lark from the Lark fake."""

from __future__ import annotations

import base64
import io

import aiohttp
import pytest
from PIL import Image

from tests.fakes.fake_anthropic import FakeAnthropic, Text
from tests.fakes.fake_lark import FakeLark
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import ServerProcess, post_event, wait_until

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


@pytest.fixture
async def serve(tmp_path, lark, model):
    env = {}
    if isinstance(model, FakeOpenAI):
        env = dict(OPENAI_API_KEY="x", OPENAI_BASE_URL=model.base_url, ETHAN_PROVIDER="openai",
                   ETHAN_MODEL="gpt-4o", ANTHROPIC_API_KEY="", ANTHROPIC_BASE_URL="")
    srv = ServerProcess(tmp_path / "home", lark, model, **env)
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
    text = model.last_user_text(req)
    assert "总结一下这条" in text
    assert ('<untrusted_content kind="quoted" source="om_parent_text" author="Bob" '
            'time="2025-11-30T02:00:00+00:00">下周三上线，别忘了备份数据库</untrusted_content>') in text
    assert lark.calls_to("/open-apis/im/v1/messages/om_parent_text", "GET")


async def test_reply_to_a_post_reads_its_markdown(serve, lark, model):
    post = {"title": "发布计划", "content": [[{"tag": "text", "text": "第一步 <b>冻结</b>"}]],
            "content_v2": "## 发布计划\n```python\nprint('freeze')\n```"}
    lark.add_message("om_parent_post", "oc_p2p_alice", msg_type="post", content=post)
    model.script(Text("好的。"))
    req = await _ask(serve, lark, model, make_text_event("这个计划靠谱吗", parent_id="om_parent_post", **ALICE))
    text = model.last_user_text(req)
    assert "## 发布计划\n```python\nprint('freeze')\n```" in text, text
    assert "<b>" not in text      # the old flattening (and tags) not used when content_v2 is there


async def test_reply_to_an_image_sends_the_image_block(serve, lark, model):
    img = png(40, 30)
    lark.add_message("om_parent_img", "oc_p2p_alice", msg_type="image", content={"image_key": "img_v3_q"})
    lark.add_resource("om_parent_img", "img_v3_q", img, "image/png")
    model.script(Text("一张蓝色的图。"))
    req = await _ask(serve, lark, model, make_text_event("图里是什么", parent_id="om_parent_img", **ALICE))
    assert _image_urls(req) == [base64.b64encode(img).decode()]
    assert "img_v3_q" in model.last_user_text(req)


async def test_reply_to_a_merged_forward_reads_its_children(serve, lark, model):
    lark.add_forward("om_parent_fwd", "oc_p2p_alice", [
        {"sender": "ou_bob", "text": "周五团建去爬山", "create_ms": 1764468000000},
        {"sender": "ou_carol", "text": "我带水", "create_ms": 1764468060000},
    ])
    model.script(Text("周五去爬山，Carol 带水。"))
    req = await _ask(serve, lark, model, make_text_event("他们定了什么", parent_id="om_parent_fwd", **ALICE))
    text = model.last_user_text(req)
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
    text = model.last_user_text(req)
    assert "could not be read" in text and "秘密" not in text
    [sent] = lark.messages(chat_id="oc_p2p_alice")
    assert "读不到" in sent.text
    assert any(e.get("event") == "quote.unreadable" for e in serve.entries())
