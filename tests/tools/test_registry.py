"""The tool port (bot/tools/registry.py): offer by policy, validation before the call, the
timeout, the size cap, fencing, errors as results, metrics per call."""

from __future__ import annotations

import asyncio

from bot.tools import ToolContext, default_registry, memory_tools
from bot.tools.registry import ToolDef, ToolPolicy, ToolRegistry
from memory.scope import Scope

P2P = Scope(user_id="ou_a", chat_id="oc_p", chat_type="p2p")
GROUP = Scope(user_id="ou_a", chat_id="oc_g", chat_type="group")
SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 10}},
          "required": ["q"], "additionalProperties": False}


class Provider:
    def __init__(self, name, *defs):
        self.name, self._defs = name, defs

    def tools(self):
        return self._defs


def ctx(scope=P2P, confirm=None):
    return ToolContext(scope=scope, facts=None, procedures=None, profile=None, confirm=confirm)


def block(name, **args):
    return {"type": "tool_use", "id": "tu_1", "name": name, "input": args}


async def test_memory_tools_keep_their_names_and_schemas():
    names = [t.name for t in memory_tools().tools()]
    assert names == ["memory_write", "procedure_write", "profile_update"]
    offer = default_registry().offer(ctx(GROUP))
    assert sorted(offer.tools) == sorted(names)     # offered in groups too, own scope


async def test_validation_timeout_cap_fence_and_errors():
    calls, seen = [], []

    async def echo(c, a):
        calls.append(a)
        return "<b>" + a["q"] * 4000

    async def hang(c, a):
        await asyncio.sleep(30)

    async def boom(c, a):
        raise RuntimeError("server went away")

    reg = ToolRegistry([Provider("x", ToolDef("x_echo", "echo", SCHEMA, echo),
                                 ToolDef("x_hang", "hang", SCHEMA, hang, timeout=0.2),
                                 ToolDef("x_boom", "boom", SCHEMA, boom))],
                       on_call=lambda *a: seen.append(a[:2]), max_result_chars=1000)
    c = ctx()
    offer = reg.offer(c)
    bad = await reg.run(offer, block("x_echo", q="far too long here"), c)
    assert bad.is_error and "invalid arguments" in bad.content and calls == []
    ok = await reg.run(offer, block("x_echo", q="ab"), c)
    assert not ok.is_error and calls == [{"q": "ab"}]
    assert ok.content.startswith('<untrusted_content kind="tool" source="x_echo"')
    assert "&lt;b&gt;" in ok.content and "<b>" not in ok.content
    assert "cut: the first 1000 of 8003 characters" in ok.content
    t0 = asyncio.get_running_loop().time()
    hung = await reg.run(offer, block("x_hang", q="a"), c)
    assert hung.is_error and "did not answer within 0.2 s" in hung.content
    assert asyncio.get_running_loop().time() - t0 < 5
    failed = await reg.run(offer, block("x_boom", q="a"), c)
    assert failed.is_error and "server went away" in failed.content
    unknown = await reg.run(offer, block("nope"), c)
    assert unknown.is_error and "unknown tool" in unknown.content
    assert seen == [("x_echo", "error"), ("x_echo", "ok"), ("x_hang", "timeout"), ("x_boom", "error"),
                    ("nope", "error")]


async def test_policy_side_effects_p2p_only_admins_and_confirmation():
    ran = []

    async def act(c, a):
        ran.append(a)
        return "done"

    reader = ToolDef("s_read", "r", SCHEMA, act)
    writer = ToolDef("s_write", "w", SCHEMA, act, read_only=False)
    admin = ToolDef("s_admin", "a", SCHEMA, act)
    reg = ToolRegistry([Provider("s", reader, writer, admin)],
                       policy=ToolPolicy(admins_only=frozenset({"s_admin"})))
    assert sorted(reg.offer(ctx(P2P)).tools) == ["s_read", "s_write"]
    assert sorted(reg.offer(ctx(GROUP)).tools) == ["s_read"]
    boss = Scope(user_id="ou_b", chat_id="oc_p", chat_type="p2p", is_admin=True)
    assert "s_admin" in reg.offer(ctx(boss)).tools

    answers = []

    async def confirm(name, args):
        answers.append((name, args))
        return len(answers) > 1      # no the first time, yes the second

    grp = ToolRegistry([Provider("s", writer)], policy=ToolPolicy(side_effects_in_groups=True))
    c = ctx(GROUP, confirm)
    offer = grp.offer(c)
    declined = await grp.run(offer, block("s_write", q="1"), c)
    assert declined.is_error and "did not confirm" in declined.content and ran == []
    done = await grp.run(offer, block("s_write", q="2"), c)
    assert not done.is_error and ran == [{"q": "2"}]
    nobody = ctx(GROUP)
    assert (await grp.run(offer, block("s_write", q="3"), nobody)).is_error and len(ran) == 1


async def test_a_failing_provider_hides_only_its_tools():
    class Broken:
        name = "broken"

        def tools(self):
            raise ConnectionError("down")

    async def act(c, a):
        return "x"

    reg = ToolRegistry([Broken(), Provider("ok", ToolDef("ok_t", "t", SCHEMA, act))])
    assert list(reg.offer(ctx()).tools) == ["ok_t"]


async def test_a_memory_write_taken_from_a_tool_result_is_refused():
    """A document a tool fetched in this turn ("名字：张三") is material: the model's memory_write
    of it is refused before any store is touched (ctx.facts is None here); the one line of the
    user's own words that says it is not."""
    async def fetch(c, a):
        return "个人简历\n名字：张三\n电话：13800001111"

    reg = ToolRegistry([memory_tools(), Provider("x", ToolDef("x_doc", "a document", SCHEMA, fetch))])
    c = ToolContext(scope=P2P, facts=None, procedures=None, profile=None, user_text="看看这份文档")
    offer = reg.offer(c)
    assert not (await reg.run(offer, block("x_doc", q="cv"), c)).is_error
    for name, args in (("memory_write", {"content": "用户名叫张三", "category": "knowledge"}),
                       ("profile_update", {"section": "基础特征", "entry": "电话 13800001111"})):
        out = await reg.run(offer, {"type": "tool_use", "id": "tu_2", "name": name, "input": args}, c)
        assert out.is_error and "third-party material" in out.content, out.content
