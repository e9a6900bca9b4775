"""``Reply`` says what it offers (issue 28): every interface's reply declares its optional members
in ``capabilities`` and implements exactly those; the agent and the handler ask that set and
never probe a reply by name (``getattr`` / ``hasattr``), read from their source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.bench_recall import _Seen
from bot.lark.outbound.reply import LarkReply
from bot.core.reply import Capability, CollectingReply, Reply, ReplyBase
from bot.infra.terminal import TerminalReply
from bot.web.chat import ChatReply
from bot.web.playground import PlaygroundReply

ROOT = Path(__file__).resolve().parents[2]

REPLIES = {
    LarkReply: {Capability.CONFIRM_TOOL, Capability.CONFIRM_COMMAND, Capability.WITHDRAW, Capability.MEMORY_CARD},
    PlaygroundReply: {Capability.MEMORY_PANEL, Capability.TOOL_PANEL},
    ChatReply: {Capability.MEMORY_PANEL, Capability.FAILURE_STATUS},
    TerminalReply: set(),
    CollectingReply: set(),
    _Seen: {Capability.MEMORY_PANEL},
}


@pytest.mark.parametrize("cls", list(REPLIES), ids=lambda c: c.__name__)
def test_a_reply_implements_exactly_what_it_declares(cls):
    assert set(cls.capabilities) == REPLIES[cls]
    for cap in Capability:
        own = getattr(cls, cap.value) is not getattr(ReplyBase, cap.value)
        assert own == (cap in cls.capabilities), (
            f"{cls.__name__}.{cap.value}: {'implemented but not declared' if own else 'declared but not implemented'}")
    for member in ("working", "stream", "finish", "delivered"):
        assert hasattr(cls, member)


def test_every_member_of_the_protocol_is_known():
    """The Protocol lists the base three, ``delivered`` and one member per Capability."""
    members = {n for n in vars(Reply) if not n.startswith("_")} | set(Reply.__annotations__)
    assert members == {"capabilities", "working", "stream", "finish", "delivered"} | {c.value for c in Capability}


@pytest.mark.parametrize("rel", ["bot/agent/agent.py", "bot/core/handler.py"])
def test_no_probing_of_a_reply(rel):
    tree = ast.parse((ROOT / rel).read_text())
    probes = [f"line {n.lineno}" for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
              and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "reply"]
    assert not probes, f"{rel} probes the reply by name: {probes}"


async def test_the_neutral_optional_members():
    r = CollectingReply()
    assert not r.delivered and not r.capabilities
    assert await r.confirm_tool("memory_write", {}) is False     # nobody to click: not run
    await r.ask_confirm("Delete everything? Reply confirm.", command="/forget all", user_id="ou_a",
                        chat_type="p2p")
    assert r.text == "Delete everything? Reply confirm."          # the question as plain text
