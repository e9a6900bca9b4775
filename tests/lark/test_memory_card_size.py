"""The /memory card stays under Lark's ~30 KB card limit however much the user has: 30 facts,
30 profile lines, 30 rules, each at its longest (bot/lark/outbound/memory_card.py: 15 with buttons, 40
more by id, the rest counted)."""

from __future__ import annotations

import json

from bot.commands.memory import MemoryItem, MemoryView
from bot.lark.outbound.memory_card import memory_card


def test_the_fullest_memory_card_stays_under_the_card_limit():
    learned = "对话中提取 · 本对话 消息 …abcdef 2026-12-02; 群聊 …abcdef 消息 …abcdef 2026-12-01; 私聊 消息 …abcdef 2026-11-30"
    items = tuple(MemoryItem(kind, i, "长<at>" * 100, "身份与背景", learned)
                  for kind in ("fact", "profile", "rule") for i in range(30))
    card = memory_card(MemoryView("…", items=items, owner="ou_a", zh=True, more=5), chat_type="p2p")
    raw = json.dumps(card, ensure_ascii=False)
    assert len(raw.encode()) < 28_000, len(raw.encode())
    assert "还有 40 条" in raw                       # 90 - 15 - 40 listed, + 5 beyond the lists
    assert "<at>" not in raw                          # an item's text cannot mention anyone
