"""Pasted Feishu document links at the wire: the model (fake, both adapters) calls
lark_doc_read; the bot reads docx raw content, a wiki node's docx and sheet values from the
fake Lark Open API with the tenant token; a document the bot cannot read gets the share answer."""

from __future__ import annotations

import pytest

from tests.fakes.fake_anthropic import ToolUse, tool_results
from tests.harness import Harness

pytestmark = pytest.mark.usefixtures("model_provider")
ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


async def _ask(h, text, n):
    await h.send_text(text, **ALICE)
    [*_, last] = await h.replies(n, timeout=20)
    return last


async def test_pasted_links_reach_the_model_and_no_access_is_told(tmp_path):
    async with Harness(tmp_path) as h:
        # Alice may open each (owner, collaborator, the organisation's link): who may is
        # tests/tools/test_lark_docs_access.py's subject
        h.lark.add_docx("doxcnPlan", "2027 计划：第一季度发布 Falcon。", owner="ou_alice")
        h.lark.add_wiki_node("wikcnTeam", "docx", "doxcnPlan", title="团队计划", link="tenant_readable")
        h.lark.add_sheet("shtcnBudget", {"s1": ("预算", [["项目", "金额"], ["Falcon", 120000]])},
                         members=[("openid", "ou_alice", "view")])
        h.lark.deny_doc("doxcnSecret")
        h.model.script(ToolUse("lark_doc_read", {"url": "https://acme.feishu.cn/docx/doxcnPlan"}))
        r1 = await _ask(h, "这份文档讲了什么？https://acme.feishu.cn/docx/doxcnPlan", 1)
        assert "第一季度发布 Falcon" in r1.text
        h.model.script(ToolUse("lark_doc_read", {"url": "https://acme.feishu.cn/wiki/wikcnTeam?from=x"}))
        r2 = await _ask(h, "https://acme.feishu.cn/wiki/wikcnTeam 呢？", 2)
        assert "[团队计划]" in r2.text and "第一季度发布 Falcon" in r2.text
        h.model.script(ToolUse("lark_doc_read", {"url": "https://acme.feishu.cn/sheets/shtcnBudget?sheet=s1"}))
        r3 = await _ask(h, "预算表 https://acme.feishu.cn/sheets/shtcnBudget?sheet=s1", 3)
        assert "Falcon\t120000" in r3.text and "## 预算" in r3.text
        h.model.script(ToolUse("lark_doc_read", {"url": "https://acme.feishu.cn/docx/doxcnSecret"}))
        await _ask(h, "https://acme.feishu.cn/docx/doxcnSecret 讲了什么", 4)
        [result] = tool_results(h.model.chat_requests()[-1].json)
        assert "NO_ACCESS" in str(result["content"]) and "share it with the bot" in str(result["content"])
        calls = [c for c in h.lark.calls if "/docx/" in c.path or "/wiki/" in c.path or "/sheets/" in c.path]
        assert calls and all(c.headers.get("Authorization", "").startswith("Bearer ") for c in calls)
