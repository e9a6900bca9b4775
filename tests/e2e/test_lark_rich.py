"""Lark beyond plain text, at the wire (issue 20): signed, encrypted webhook events through
the app; resources, forwarded children and card clicks served by the fake Lark; the model's
requests read back from the fake Anthropic.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from tests.fakes.fake_anthropic import Stall, Text, ToolUse
from tests.fakes.fake_lark import server_error
from tests.fakes.lark_events import (
    make_bot_added_event, make_card_action_event, make_file_event, make_forward_event,
    make_image_event, make_p2p_entered_event, make_recalled_event, make_text_event,
)
from tests import harness
from tests.reliability.bombs import pdf_file
from tests.harness import Harness

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends

REPO = Path(__file__).resolve().parents[2]
ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


def png(w: int, h: int, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def noisy_png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (w, h), os.urandom(w * h * 3)).save(buf, format="PNG")
    return buf.getvalue()


def pdf_with_text(text: str) -> bytes:
    """A one-page PDF whose content stream shows ``text`` (Helvetica), xref offsets exact."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return pdf_file(objs)


def images_in(req) -> list[dict]:
    last = [m for m in req.json["messages"] if m["role"] == "user"][-1]
    content = last["content"] if isinstance(last["content"], list) else []
    return [b for b in content if b.get("type") == "image"]


async def post_ok(h, event) -> str:
    status, body = await h.post(event)
    assert status == 200, (status, body)
    got = json.loads(body)
    return got.get("msg") or got      # a card click's answer is its toast (and card)


# -- images ------------------------------------------------------------------------------------

async def test_image_bytes_reach_the_model_as_an_image_block(tmp_path):
    async with Harness(tmp_path) as h:
        small = png(64, 48)
        ev = make_image_event("img_v3_small", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_small", small, "image/png")
        h.model.script(Text("一张红色的图。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        req = h.model.chat_requests()[-1]
        blocks = images_in(req)
        assert len(blocks) == 1
        src = blocks[0]["source"]
        assert src["type"] == "base64" and src["media_type"] == "image/png"
        assert base64.b64decode(src["data"]) == small                       # small: sent as received
        call = h.lark.calls_to("/resources/img_v3_small")[0]
        assert call.query.get("type") == "image"
        # History keeps a reference, not the bytes.
        row = await h.app.db.fetchone("SELECT content FROM messages WHERE role = 'user'")
        assert "img_v3_small" in row["content"] and len(row["content"]) < 200


async def test_large_image_is_downscaled_and_post_images_are_read(tmp_path):
    async with Harness(tmp_path) as h:
        big = noisy_png(2400, 1200)
        content = {"title": "", "content": [[{"tag": "text", "text": "看看这张"}],
                                            [{"tag": "img", "image_key": "img_v3_big"}]]}
        ev = make_text_event("", message_type="post", content=content, **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_big", big, "image/png")
        h.model.script(Text("好的。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        blocks = images_in(h.model.chat_requests()[-1])
        assert len(blocks) == 1 and blocks[0]["source"]["media_type"] == "image/jpeg"
        with Image.open(io.BytesIO(base64.b64decode(blocks[0]["source"]["data"]))) as img:
            assert max(img.size) == 1568 and img.size[0] / img.size[1] == 2
        assert "看看这张" in h.model.last_user_text(h.model.chat_requests()[-1])


async def test_model_without_vision_gets_a_text_note(tmp_path):
    async with Harness(tmp_path, ethan_model="some-text-only-model") as h:
        ev = make_image_event("img_v3_nv", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_nv", png(8, 8), "image/png")
        h.model.script(Text("我看不到图。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        req = h.model.chat_requests()[-1]
        assert images_in(req) == []
        assert "cannot see images" in h.model.last_user_text(req)
        assert not h.lark.calls_to("/resources/")                           # not even downloaded


# -- files and forwards -----------------------------------------------------------------------

async def test_pdf_text_reaches_the_model(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_pdf", "report.pdf", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_pdf",
                            pdf_with_text("Quarterly revenue grew 42 percent"), "application/pdf")
        h.model.script(Text("收到报告。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        text = h.model.last_user_text(h.model.chat_requests()[-1])
        assert "Quarterly revenue grew 42 percent" in text and "report.pdf" in text
        assert h.lark.calls_to("/resources/file_v3_pdf")[0].query.get("type") == "file"


def _docx() -> bytes:
    import docx

    d = docx.Document()
    d.add_heading("季度复盘", 1)
    d.add_paragraph("华东区收入增长 42%，主要来自新客户。")
    table = d.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "负责人", "林一"
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def _pptx() -> bytes:
    import pptx

    deck = pptx.Presentation()
    for i in range(1, 12):                      # 11 slides: slide10.xml must not sort before slide2.xml
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"第{i}页"
        slide.placeholders[1].text = f"要点 {i}: launch plan item {i}"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def _xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["城市", "销量"])
    sheet.append(["上海", 1200])
    sheet.append(["杭州", 860.5])
    other = book.create_sheet("Q2")
    other.append(["Shenzhen", 990])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _xlsx_shared_strings() -> bytes:
    import xlsxwriter                            # writes text as shared strings, as Excel does

    out = io.BytesIO()
    book = xlsxwriter.Workbook(out)
    sheet = book.add_worksheet()
    sheet.write_row(0, 0, ["城市", "销量"])
    sheet.write_row(1, 0, ["上海", 1200])
    book.close()
    return out.getvalue()


@pytest.mark.parametrize("name, build, expect", [
    ("review.docx", _docx, ["季度复盘", "华东区收入增长 42%，主要来自新客户。", "负责人", "林一"]),
    ("deck.pptx", _pptx, ["# slide 1\n第1页\n要点 1: launch plan item 1", "# slide 11\n第11页"]),
    ("sales.xlsx", _xlsx, ["城市\t销量", "上海\t1200", "杭州\t860.5", "Shenzhen\t990"]),   # inline strings
    ("excel.xlsx", _xlsx_shared_strings, ["城市\t销量", "上海\t1200"]),
])
async def test_office_file_text_reaches_the_model(tmp_path, name, build, expect):
    """Files written by the real python-docx / python-pptx / openpyxl / XlsxWriter, read by our
    standard-library reader."""
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_office", name, **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_office", build(),
                            "application/octet-stream")
        h.model.script(Text("读完了。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        text = h.model.last_user_text(h.model.chat_requests()[-1])
        assert name in text
        for piece in expect:
            assert piece in text, (piece, text[:2000])
        if name.endswith(".pptx"):
            assert text.index("# slide 2\n") < text.index("# slide 10\n") < text.index("# slide 11\n")


async def test_long_text_file_is_cut_with_a_note(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_md", "notes.md", **ALICE)
        body = ("# 标题\n" + "很长的一行笔记。" * 8000).encode()
        h.lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_md", body, "text/markdown")
        h.model.script(Text("读了前面部分。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        text = h.model.last_user_text(h.model.chat_requests()[-1])
        assert "# 标题" in text and "first 30000 characters only" in text
        assert len(text) < 32_000


async def test_merged_forward_children_reach_the_model_in_one_turn(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_forward_event(**ALICE)
        mid = ev["event"]["message"]["message_id"]
        h.lark.add_forward(mid, "oc_p2p_alice", [
            {"sender": "ou_bob", "text": "明天十点开会", "create_ms": 1764468000000},
            {"sender": "ou_carol", "text": "我带投影仪", "create_ms": 1764468060000},
        ])
        h.model.script(Text("他们约了明天十点开会。"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        reqs = h.model.chat_requests()
        assert len(reqs) == 1
        text = h.model.last_user_text(reqs[0])
        # each child fenced as data with its sender (bot.agent.prompt.fence_material)
        assert 'author="Bob"' in text and 'author="Carol"' in text
        assert '<untrusted_content kind="forward"' in text
        assert text.index("明天十点开会") < text.index("我带投影仪")


# -- bad input ------------------------------------------------------------------------------------

async def _refused(h, ev, *, expect: str) -> str:
    await post_ok(h, ev)
    [msg] = await h.replies(1)
    await h.idle()
    assert expect in msg.text, msg.text
    assert h.model.chat_requests() == []                                   # the model never asked
    row = await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages")
    assert row["n"] == 0                                                    # nothing stored half
    return msg.text


async def test_oversized_image_gets_a_short_answer(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_image_event("img_v3_huge", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_huge",
                            b"\x89PNG\r\n\x1a\n" + b"\0" * (10 * 1024 * 1024 + 1), "image/png")
        await _refused(h, ev, expect="太大")


async def test_oversized_file_is_refused_from_its_declared_size(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_big", "big.txt", **ALICE)
        content = json.loads(ev["event"]["message"]["content"])
        content["file_size"] = 50 * 1024 * 1024
        ev["event"]["message"]["content"] = json.dumps(content)
        await _refused(h, ev, expect="太大")
        assert not h.lark.calls_to("/resources/")


async def test_unreachable_resource_gets_a_short_answer(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_image_event("img_v3_5xx", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_5xx", png(8, 8), "image/png")
        h.lark.fail_next("/resources/", **server_error(503))
        await _refused(h, ev, expect="取不到")


async def test_resource_without_permission_names_the_scope(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_perm", "a.txt", **ALICE)
        h.lark.fail_next("/resources/", status=400, code=99991672, msg="Access denied. One of the following scopes is required: [im:message, im:message:readonly]")
        await _refused(h, ev, expect="im:message:readonly")


async def test_pdf_that_is_not_a_pdf(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_fake", "fake.pdf", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_fake", b"PK\x03\x04 not a pdf", "application/pdf")
        await _refused(h, ev, expect="不是有效的 PDF")


async def test_unsupported_file_type(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_file_event("file_v3_exe", "setup.exe", **ALICE)
        await _refused(h, ev, expect=".exe")


# -- recall ---------------------------------------------------------------------------------------

def _cli(home: Path, *args: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ETHAN_HOME": str(home),
           "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8"}
    if harness.DATABASE_URL["url"]:    # the app ran on PostgreSQL: so does the CLI
        env["ETHAN_DATABASE_URL"] = harness.DATABASE_URL["url"]
    out = subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True,
                         encoding="utf-8", cwd=home, env=env, timeout=120)
    return out.stdout + out.stderr


async def test_recall_removes_the_message_from_requests_search_and_export(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(ToolUse("memory_write", {"content": "Alice 下周去 hunter2 市出差", "category": "knowledge"}),
                       Text("好的，记下你的密码 hunter2。"), Text("你好。"))
        secret = await h.send_text("我的密码是 hunter2 别告诉别人", **ALICE)
        await h.replies(1)
        await h.idle()
        mid = secret["event"]["message"]["message_id"]
        assert await _facts(h) == 1                                         # learned from that message
        # a recall naming another chat leaves the message alone (issue 32 Low)
        assert await post_ok(h, make_recalled_event(mid, chat_id="oc_other_chat")) == "accepted"
        await h.idle()
        assert await _facts(h) == 1
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages WHERE content LIKE '%hunter2%'"))["n"] >= 1
        assert await post_ok(h, make_recalled_event(mid, chat_id="oc_p2p_alice")) == "accepted"
        await h.idle()
        await h.send_text("你好", **ALICE)
        await h.replies(2)
        await h.idle()
        req = h.model.chat_requests()[-1]
        assert "hunter2" not in json.dumps(req.json, ensure_ascii=False)     # history, and the fact
        assert await _facts(h) == 0
        if h.app.db.dialect == "sqlite":   # the FTS5 index holds no trace of it
            assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages_fts WHERE messages_fts MATCH 'hunter2'"))["n"] == 0
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages WHERE content LIKE '%hunter2%'"))["n"] == 0
        audit = await h.app.db.fetchone("SELECT action, target FROM audit WHERE action = 'message.recalled'")
        assert audit["target"] == mid
        # A redelivery of the recall is a duplicate; the recall was not one of the message.
        assert await post_ok(h, make_recalled_event(mid, chat_id="oc_p2p_alice")) == "duplicate"
    search = await asyncio.to_thread(_cli, tmp_path, "session", "search", "hunter2")
    assert "no session matches" in search, search
    out = tmp_path / "export"
    await asyncio.to_thread(_cli, tmp_path, "memory", "export", "--user", "ou_alice", "--out", str(out))
    assert out.exists()
    assert not any("hunter2" in p.read_text(encoding="utf-8", errors="ignore") for p in out.rglob("*") if p.is_file())


async def test_recall_cancels_a_pending_reply(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Stall(seconds=1.5), Text("第一条的回答"), Text("不该发出"))
        await h.send_text("第一条", **ALICE)
        await h.model.wait_for_requests_async(1)
        second = await h.send_text("第二条：说错了", **ALICE)      # waits behind the first
        mid = second["event"]["message"]["message_id"]
        await post_ok(h, make_recalled_event(mid, chat_id="oc_p2p_alice"))
        await h.idle(timeout=20)
        texts = [m.text for m in h.lark.messages()]
        assert all("不该发出" not in t for t in texts), texts
        assert not any(m.reply_to == mid for m in h.lark.messages())
        row = await h.app.db.fetchone("SELECT status, note FROM inbox WHERE dedup_key = ?", (f"msg:{mid}",))
        assert (row["status"], row["note"]) == ("ignored", "recalled")


async def test_recall_replies_recalls_the_answer_when_enabled(tmp_path):
    async with Harness(tmp_path, ethan_recall_replies=True) as h:
        h.model.script(Text("收到：机密内容"))
        ev = await h.send_text("机密内容", **ALICE)
        [answer] = await h.replies(1)
        await h.idle()
        await post_ok(h, make_recalled_event(ev["event"]["message"]["message_id"], chat_id="oc_p2p_alice"))
        await h.idle()
        assert h.lark.calls_to(f"/messages/{answer.message_id}", method="DELETE")


# -- joining --------------------------------------------------------------------------------------

async def test_group_join_sends_one_introduction_and_p2p_greets_once(tmp_path):
    async with Harness(tmp_path) as h:
        added = make_bot_added_event("oc_team")
        await post_ok(h, added)
        await post_ok(h, added)                                            # redelivered
        await h.idle()
        intro = h.lark.messages(chat_id="oc_team")
        assert len(intro) == 1 and "/help" in intro[0].text and "@" in intro[0].text
        await post_ok(h, make_p2p_entered_event("oc_p2p_alice"))
        await h.idle()
        await post_ok(h, make_p2p_entered_event("oc_p2p_alice"))           # a new event: entered again
        await h.idle()
        assert len(h.lark.messages(chat_id="oc_p2p_alice")) == 1
        await post_ok(h, make_bot_added_event("oc_team", deleted=True))
        await h.idle()
        await h.send_text("还在吗", chat_id="oc_team", chat_type="group", sender="ou_alice")
        await h.idle()
        assert len(h.lark.messages(chat_id="oc_team")) == 1                # removed: stops answering
        await h.restart()                                                  # ... and remembers it
        before = len(h.lark.messages())
        await h.send_text("重启后还在吗", chat_id="oc_team", chat_type="group", sender="ou_alice")
        await h.idle()
        assert len(h.lark.messages()) == before
        await post_ok(h, make_bot_added_event("oc_team"))                  # added again: answers again
        await h.idle()
        await h.send_text("回来了吗", chat_id="oc_team", chat_type="group", sender="ou_alice")
        await h.idle()
        assert len(h.lark.messages()) == before + 2                        # the introduction + the answer


async def test_unknown_event_type_is_acknowledged_and_ignored(tmp_path):
    async with Harness(tmp_path) as h:
        ev = make_recalled_event("om_x", chat_id="oc_p2p_alice")
        ev["header"]["event_type"] = "im.message.reaction.created_v1"
        assert await post_ok(h, ev) == "ignored"


# -- buttons --------------------------------------------------------------------------------------

async def test_confirm_button_erases_once_and_only_for_the_asker(tmp_path):
    async with Harness(tmp_path) as h:
        await h.app.memory.facts.add(_scope("ou_alice"), "Alice 喜欢乌龙茶", "preference", source="user_edit")
        await h.send_text("/forget all", **ALICE)
        [card] = await h.replies(1)
        await h.idle()
        assert card.msg_type == "interactive"
        assert "/forget all confirm" in json.dumps(card.content, ensure_ascii=False)   # the typed way is named
        value = {"ethan": "confirm", "cmd": "/forget all confirm", "user": "ou_alice", "chat_type": "p2p"}
        # Another user's click is refused.
        await post_ok(h, make_card_action_event(value, chat_id="oc_p2p_alice", message_id=card.message_id,
                                                operator="ou_bob"))
        await h.idle()
        assert await _facts(h) == 1
        # The asker's click erases and the card shows the outcome.
        await post_ok(h, make_card_action_event(value, chat_id="oc_p2p_alice", message_id=card.message_id))
        await h.idle()
        assert await _facts(h) == 0
        patched = h.lark.message(card.message_id)
        assert patched.edits == 1 and "已执行" in json.dumps(patched.current_content, ensure_ascii=False)
        # A second click does nothing.
        await h.app.memory.facts.add(_scope("ou_alice"), "Alice 喜欢红茶", "preference", source="user_edit")
        await post_ok(h, make_card_action_event(value, chat_id="oc_p2p_alice", message_id=card.message_id))
        await h.idle()
        assert await _facts(h) == 1 and h.lark.message(card.message_id).edits == 1
        # The typed confirm still works.
        await h.send_text("/forget all confirm", **ALICE)
        await h.replies(2)
        await h.idle()
        assert await _facts(h) == 0


def _scope(user: str):
    from memory.scope import Scope
    return Scope(user_id=user, chat_id=f"oc_p2p_{user[3:]}", chat_type="p2p", thread_id="", message_id="",
                 is_admin=False)


async def _facts(h) -> int:
    row = await h.app.db.fetchone("SELECT COUNT(*) AS n FROM facts")
    return row["n"]


__all__ = ["zlib"]


async def test_image_reaches_an_openai_compatible_model_as_image_url(tmp_path):
    async with Harness(tmp_path, provider="openai") as h:
        small = png(32, 32)
        ev = make_image_event("img_v3_oa", **ALICE)
        h.lark.add_resource(ev["event"]["message"]["message_id"], "img_v3_oa", small, "image/png")
        h.model.script(Text("a red square"))
        await post_ok(h, ev)
        await h.replies(1)
        await h.idle()
        req = h.model.chat_requests()[-1]
        assert "/chat/completions" in req.path
        last = [m for m in req.wire["messages"] if m["role"] == "user"][-1]   # as sent
        urls = [p["image_url"]["url"] for p in last["content"] if isinstance(p, dict) and p.get("type") == "image_url"]
        assert urls == ["data:image/png;base64," + base64.b64encode(small).decode()], last
