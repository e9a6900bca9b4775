"""The model never turns third-party text into the user's facts or profile (issue 32 M5, the
tool side): a memory_write / profile_update call whose content a forwarded message, a quoted
message or a tool result in that turn supplied — not the user's own words — is refused
(``is_error``) and writes nothing; the user's own words still count. Signed webhook events
through the app, the forward and the quoted message served by the fake Lark, on both model
adapters and both backends. (The consolidation side: tests/trust/test_material.py.)
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, tool_results
from tests.fakes.lark_events import make_forward_event, make_text_event
from tests.harness import Harness

pytestmark = [pytest.mark.usefixtures("model_provider"), pytest.mark.app_backends]

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
CV = "个人简历\n名字：张三\n电话：13800001111\n职位：后端工程师"


async def _post(h, event) -> None:
    n = len(h.lark.messages()) + 1
    status, _ = await h.post(event)
    assert status == 200
    await h.replies(n)
    await h.idle()


def _results(h, since: int) -> list[str]:
    out = []
    for r in h.model.chat_requests()[since:]:
        out += [json.dumps(b, ensure_ascii=False) for b in tool_results(r.json)]
    return out


async def _memory(h) -> tuple[list[str], list[str]]:
    facts = [r["content"] for r in await h.app.db.fetchall("SELECT content FROM facts")]
    entries = [r["entry"] for r in await h.app.db.fetchall("SELECT entry FROM profile_entries")]
    return facts, entries


async def test_writes_taken_from_a_forwarded_cv_or_a_quote_are_refused(tmp_path):
    async with Harness(tmp_path) as h:
        # 1. a forwarded stranger's CV: the model takes its name and phone for the user's
        fwd = make_forward_event(**ALICE)
        h.lark.add_forward(fwd["event"]["message"]["message_id"], "oc_p2p_alice",
                           [{"sender": "ou_bob", "text": CV, "create_ms": 1764468000000}])
        h.model.script(ToolUse("memory_write", {"content": "用户名叫张三", "category": "knowledge"}),
                       ToolUse("profile_update", {"section": "基础特征", "entry": "名字：张三，电话 13800001111"}),
                       Text("这是张三的简历。"))
        before = len(h.model.chat_requests())
        await _post(h, fwd)
        results = _results(h, before)
        assert len(results) == 2 and all('"is_error": true' in r and "third-party material" in r
                                         for r in results), results
        assert await _memory(h) == ([], [])

        # 2. a quoted message from Bob, the user asking to note it down
        h.lark.add_message("om_quoted_cv", "oc_p2p_alice", text="我的名字：王五，住在杭州西湖区", sender="ou_bob")
        h.model.script(ToolUse("memory_write", {"content": "用户住在杭州西湖区", "category": "knowledge"}),
                       Text("好的。"))
        before = len(h.model.chat_requests())
        await _post(h, make_text_event("记一下", parent_id="om_quoted_cv", **ALICE))
        [result] = _results(h, before)
        assert '"is_error": true' in result and "third-party material" in result, result
        assert await _memory(h) == ([], [])

        # 3. the user's own words count, beside the same material; and a fact about someone
        #    else that the user explicitly asks to keep is theirs to keep
        h.lark.add_message("om_quoted_cv2", "oc_p2p_alice", text=CV, sender="ou_bob")
        h.model.script(ToolUse("memory_write", {"content": "用户名叫李四", "category": "knowledge"}),
                       ToolUse("memory_write", {"content": "用户的同事张三是后端工程师", "category": "knowledge"}),
                       Text("好的，李四。"))
        fwd = make_text_event("我叫李四，记住：这是我同事的简历", parent_id="om_quoted_cv2", **ALICE)
        before = len(h.model.chat_requests())
        await _post(h, fwd)
        results = _results(h, before)
        assert len(results) == 2 and not any('"is_error": true' in r for r in results), results
        facts, entries = await _memory(h)
        assert sorted(facts) == ["用户名叫李四", "用户的同事张三是后端工程师"] and entries == [], facts
