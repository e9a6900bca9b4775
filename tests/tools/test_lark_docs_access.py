"""Issue 45 N2 at the wire: the doc reader is no confused deputy. Signed webhook events from
different askers; the fake model calls ``lark_doc_read`` with the link; the fake Lark serves
each document's owner, link sharing and collaborators (drive permission APIs, tenant token).
A document's text reaches the model only for an asker Lark's own settings show may read it —
never "because the bot can" — and every refusal is one ``docs.refused`` line with the ids."""

from __future__ import annotations

import pytest

from tests.fakes.fake_anthropic import ToolUse, tool_results
from tests.harness import Harness
from tests.reliability.support import LogCapture

pytestmark = pytest.mark.usefixtures("model_provider")

HR_TEXT = "2027 薪资表：张三 月薪 88,000；李四 月薪 91,500"
HR = "https://acme.feishu.cn/docx/doxcnHR"
STRANGER = dict(sender="ou_mallory", chat_id="oc_p2p_mallory")
ALICE = dict(sender="ou_alice", chat_id="oc_p2p_alice")
BOB_IN_TEAM = dict(sender="ou_bob", chat_id="oc_team", chat_type="group")
EXTERNAL = dict(sender="ou_ext", chat_id="oc_shared", chat_type="group", sender_tenant_key="tk_partner")


class Asker:
    """Sends one question per call and returns (reply text, tool result) for it."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.n = 0

    async def __call__(self, url: str, **who) -> tuple[str, str]:
        self.h.model.script(ToolUse("lark_doc_read", {"url": url}))
        await self.h.send_text(f"这份文档讲了什么？{url}", **who)
        self.n += 1
        *_, last = await self.h.replies(self.n, timeout=20)
        [result] = tool_results(self.h.model.chat_requests()[-1].json)
        return last.text, str(result["content"])


def _raw_reads(h: Harness, token: str) -> list:
    return h.lark.calls_to(f"/docx/v1/documents/{token}/raw_content")


async def test_the_hr_sheet_shared_only_with_alice_reaches_alice_and_nobody_else(tmp_path):
    async with Harness(tmp_path) as h:
        h.lark.add_docx("doxcnHR", HR_TEXT, owner="ou_hrlead", members=[("openid", "ou_alice", "view")])
        ask = Asker(h)
        with LogCapture() as captured:
            logs = captured.entries
            for who in (STRANGER, BOB_IN_TEAM, EXTERNAL):
                reply, result = await ask(HR, **who)
                assert "NOT_ALLOWED" in result, (who, result)
                assert "88,000" not in reply and "88,000" not in result
            assert not _raw_reads(h, "doxcnHR"), "the document was read for someone not shown to have access"
            assert not any("88,000" in str(r.json) for r in h.model.requests)

            reply, result = await ask(HR, **ALICE)
            assert "张三 月薪 88,000" in result and "张三 月薪 88,000" in reply
        assert len(_raw_reads(h, "doxcnHR")) == 1
        refused = [e for e in logs if e["event"] == "docs.refused"]
        assert [(e["user_id"], e["chat_id"], e["token"], e["why"]) for e in refused] == [
            ("ou_mallory", "oc_p2p_mallory", "doxcnHR", "not shown"),
            ("ou_bob", "oc_team", "doxcnHR", "not shown"),
            ("ou_ext", "oc_shared", "doxcnHR", "not shown")]
        assert all(e["message_id"].startswith("om_") for e in refused)
        [read] = [e for e in logs if e["event"] == "docs.read"]
        assert (read["user_id"], read["token"], read["why"]) == ("ou_alice", "doxcnHR", "collaborator")
        # the checks go through the drive permission APIs with the tenant token
        checks = h.lark.calls_to("/open-apis/drive/")
        assert checks and all(c.headers.get("Authorization", "").startswith("Bearer t-") for c in checks)
        assert {c.query.get("type") for c in checks if "/permissions/" in c.path} == {"docx"}


async def test_an_organisation_link_serves_the_organisation_and_an_open_link_anyone(tmp_path):
    async with Harness(tmp_path) as h:
        h.lark.add_docx("doxcnHandbook", "员工手册：年假 15 天。", owner="ou_hrlead", link="tenant_readable")
        h.lark.add_docx("doxcnPress", "新闻稿：Falcon 发布。", owner="ou_hrlead", link="anyone_readable",
                        external="open")
        h.lark.add_docx("doxcnHalfOpen", "对外草稿：尚未公开。", owner="ou_hrlead", link="anyone_readable",
                        external="closed")
        ask = Asker(h)
        handbook = "https://acme.feishu.cn/docx/doxcnHandbook"
        _, result = await ask(handbook, **BOB_IN_TEAM)
        assert "年假 15 天" in result
        _, result = await ask(handbook, **EXTERNAL)
        assert "NOT_ALLOWED" in result and "年假" not in result
        _, result = await ask("https://acme.feishu.cn/docx/doxcnPress", **EXTERNAL)
        assert "Falcon 发布" in result
        # "anyone with the link" holds only while the document is open to outside the organisation
        _, result = await ask("https://acme.feishu.cn/docx/doxcnHalfOpen", **EXTERNAL)
        assert "NOT_ALLOWED" in result
        _, result = await ask("https://acme.feishu.cn/docx/doxcnHalfOpen", **STRANGER)
        assert "尚未公开" in result      # a member of the organisation: the link is theirs
        assert len(_raw_reads(h, "doxcnHandbook")) == 1 and len(_raw_reads(h, "doxcnHalfOpen")) == 1


async def test_a_document_shared_with_a_group_is_read_in_that_group_only(tmp_path):
    async with Harness(tmp_path) as h:
        h.lark.add_docx("doxcnRoadmap", "路线图：Q3 上线 Falcon。", members=[("openchat", "oc_team", "view")])
        ask = Asker(h)
        url = "https://acme.feishu.cn/docx/doxcnRoadmap"
        _, result = await ask(url, **BOB_IN_TEAM)
        assert "Q3 上线 Falcon" in result
        _, result = await ask(url, sender="ou_bob", chat_id="oc_p2p_bob")
        assert "NOT_ALLOWED" in result
        # an external member of that very group: a chat's share reaches outsiders only when the
        # document is open to them
        _, result = await ask(url, sender="ou_ext", chat_id="oc_team", chat_type="group",
                              sender_tenant_key="tk_partner")
        assert "NOT_ALLOWED" in result


async def test_a_wiki_page_is_checked_on_its_node_and_a_sheet_by_its_owner(tmp_path):
    async with Harness(tmp_path) as h:
        h.lark.add_docx("doxcnComp", "薪酬方案：P7 年包 120 万。", link="tenant_readable")
        # the page's own settings decide (the node), not the document's
        h.lark.add_wiki_node("wikcnComp", "docx", "doxcnComp", title="薪酬", owner="ou_alice")
        h.lark.add_sheet("shtcnPay", {"s1": ("工资", [["姓名", "月薪"], ["张三", 88000]])}, owner="ou_alice")
        ask = Asker(h)
        for url in ("https://acme.feishu.cn/wiki/wikcnComp", "https://acme.feishu.cn/sheets/shtcnPay?sheet=s1"):
            _, result = await ask(url, **BOB_IN_TEAM)
            assert "NOT_ALLOWED" in result, (url, result)
        assert not _raw_reads(h, "doxcnComp") and not h.lark.calls_to("/sheets/v2/spreadsheets/shtcnPay")
        assert not h.lark.calls_to("/wiki/v2/spaces/get_node"), "the node was resolved before the check"
        _, result = await ask("https://acme.feishu.cn/wiki/wikcnComp", **ALICE)
        assert "[薪酬]" in result and "P7 年包 120 万" in result
        _, result = await ask("https://acme.feishu.cn/sheets/shtcnPay?sheet=s1", **ALICE)
        assert "张三\t88000" in result
        types = {(c.path.split("/")[5], c.query.get("type")) for c in h.lark.calls_to("/drive/v2/permissions/")}
        assert types == {("wikcnComp", "wiki"), ("shtcnPay", "sheet")}
        metas = [c.json["request_docs"] for c in h.lark.calls_to("/drive/v1/metas/batch_query")]
        assert [{"doc_token": "wikcnComp", "doc_type": "wiki"}] in metas
        assert [{"doc_token": "shtcnPay", "doc_type": "sheet"}] in metas


async def test_a_check_that_fails_refuses_and_a_repeated_read_is_not_checked_again(tmp_path):
    async with Harness(tmp_path) as h:
        h.lark.add_docx("doxcnPlan", "2027 计划：第一季度发布 Falcon。", owner="ou_alice")
        ask = Asker(h)
        url = "https://acme.feishu.cn/docx/doxcnPlan"
        h.lark.fail_next("/drive/v2/permissions/doxcnPlan/public", status=500, code=1063006,
                         msg="internal error")
        h.lark.fail_next("/drive/v1/metas/batch_query", status=400, code=99991672,
                         msg="Access denied. One of the following scopes is required: [drive:drive.metadata:readonly]")
        with LogCapture() as captured:
            logs = captured.entries
            _, result = await ask(url, **ALICE)
            assert "CHECK_FAILED" in result and "Falcon" not in result
            _, result = await ask(url, **ALICE)        # the app lacks the owner lookup's scope
            assert "document-permission scopes" in result and "Falcon" not in result
        assert not _raw_reads(h, "doxcnPlan")
        lines = [e for e in logs if e["event"] == "docs.refused"]
        assert [(e["why"], e["code"], e["user_id"], e["token"]) for e in lines] == [
            ("check failed", 1063006, "ou_alice", "doxcnPlan"), ("missing scope", 99991672, "ou_alice", "doxcnPlan")]
        assert "drive:drive.metadata:readonly" in lines[1]["missing_scope"]
        # a failed check is not remembered: the next ask checks again and reads
        _, result = await ask(url, **ALICE)
        assert "第一季度发布 Falcon" in result
        checks = len(h.lark.calls_to("/open-apis/drive/"))
        _, result = await ask(url, **ALICE)
        assert "第一季度发布 Falcon" in result
        assert len(h.lark.calls_to("/open-apis/drive/")) == checks, "the decision was not kept"
        assert len(_raw_reads(h, "doxcnPlan")) == 2
