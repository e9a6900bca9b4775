"""Issue 17, Low: "a long message grows every later request by ~8k characters — check it
levels off". Where it is capped (memory/working/view.py, documented in docs/reliability.md):

- the current input is cut at ``MAX_TEXT_CHARS`` (20 000, bot/lark/normalize.py);
- once stored, every replayed message — the long question and its long answer — is cut at
  ``REPLAY_CAP`` (4 000 characters) in the hot zone: that is the ~8k per later request;
- every turn since the last compression is replayed (no hole): ``hot_size`` (10) to
  ``hot_size + compress_batch - 1`` (14) turns; once ``hot_size + compress_batch`` complete
  turns are uncompressed the oldest ``compress_batch`` become one warm summary (bounded by the
  summarizer), so the long turn stops costing anything verbatim after 15 turns;
- if consolidation is behind or failing, uncompressed turns keep being replayed up to
  ``MemoryConfig.replay_budget`` (24 000 estimated tokens; the newest 14 always replayed),
  then the oldest are trimmed with a marker: the long turn then costs its two capped
  messages (≤ 8k characters) on every request, no more.

At the wire: two conversations with the same short messages, one of them opened by a 20 000
character message; the fake model records every request."""

from __future__ import annotations

import json

from bot.lark.normalize import MAX_TEXT_CHARS
from memory.working.view import REPLAY_CAP, MemoryConfig
from tests.harness import Harness

FOLLOW_UPS = 18


def _chars(req) -> int:
    return len(json.dumps(req.json["messages"], ensure_ascii=False))


async def _conversation(h, chat: str, first: str) -> list[int]:
    sizes = []
    for i, text in enumerate([first] + [f"第{i}条短消息，继续聊项目进度" for i in range(FOLLOW_UPS)]):
        before = len(h.model.chat_requests())
        await h.send_text(text, chat_id=chat, sender="ou_" + chat.split("_")[-1])
        await h.idle(timeout=30)
        reqs = h.model.chat_requests()[before:]
        sizes.append(_chars(reqs[0]))
    return sizes


async def test_a_long_message_costs_at_most_two_replay_caps_and_then_nothing(tmp_path):
    config = MemoryConfig()
    async with Harness(tmp_path, memory_config=config) as h:
        h.model.on_tool("write_summary", lambda req: {"summary": "(summary)"}, keys={"summary"})
        h.model.on_tool("extract_memories", lambda req: {"facts": [], "profile_psych": []},
                        keys={"facts", "profile_psych"})
        long = await _conversation(h, "oc_p2p_long", "长" * (MAX_TEXT_CHARS + 5000))
        short = await _conversation(h, "oc_p2p_short", "一条普通的开场消息")
    extra = [a - b for a, b in zip(long, short)]
    assert extra[0] <= MAX_TEXT_CHARS + 500, extra[0]               # the input itself: cut at 20k
    # While the long turn is replayed (every turn since the last compression: up to
    # hot_size + compress_batch - 1 of them): its question and its answer, each cut at REPLAY_CAP.
    window = config.hot_size + config.compress_batch
    replayed = extra[1:window]
    print("extra chars per request (long - short):", extra)
    assert all(REPLAY_CAP <= x <= 2 * REPLAY_CAP + 500 for x in replayed), extra
    # Levels off: once it is compressed only its (bounded) summary remains.
    after = extra[window:]
    assert after and all(abs(x) <= 600 for x in after), (extra, long, short)
