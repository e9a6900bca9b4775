"""Which memory a message gets: the fast, medium or full path (DESIGN.md §6).

A small table, checked in order; the first rule that matches decides.

| path   | when                                                   | facts | profile | episodes |
|--------|--------------------------------------------------------|-------|---------|----------|
| fast   | short small talk: greetings, thanks, acks (≤ 12 chars) | top 5 | no      | no       |
| full   | asks about the past ("上次", "remember when", …) or is   | top 15| yes     | recall   |
|        | substantial (≥ 40 characters)                          |       |         |          |
| medium | everything else                                        | top 15| yes     | recall   |

Whether an episode is injected is not decided here by the message's length or wording:
on both the medium and the full path ``EpisodeStore.recall`` asks the index (issue 19 —
"When did Jon lose his job?" is 38 characters and has no cue, yet is about a past session).
Only small talk skips the lookup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory.text.similarity import normalise


@dataclass(frozen=True, slots=True)
class Path:
    name: str
    fact_limit: int
    profile: bool
    episodes: bool


FAST = Path("fast", 5, False, False)
MEDIUM = Path("medium", 15, True, True)
FULL = Path("full", 15, True, True)

SMALL_TALK = {
    "hi", "hello", "hey", "thanks", "thankyou", "thx", "ok", "okay", "cool", "nice", "bye", "goodnight",
    "goodmorning", "lol", "haha", "yes", "no", "sure", "great",
    "你好", "您好", "嗨", "哈喽", "谢谢", "多谢", "感谢", "好的", "好", "嗯", "嗯嗯", "哈哈", "哈哈哈", "早",
    "早上好", "晚安", "拜拜", "再见", "收到", "行", "可以", "没问题", "对", "是的", "在吗", "在么", "午安",
}
RECALL_CUES = re.compile(
    r"(上次|之前|以前|那次|还记得|记得吗|我们聊过|我们讨论|讨论过|说过|提到过|"
    r"last time|before|earlier|previously|remember when|do you remember|we talked|we discussed|you said)",
    re.IGNORECASE,
)
FAST_MAX_CHARS = 12
FULL_MIN_CHARS = 40


def route(text: str) -> Path:
    norm = normalise(text)
    if len(norm) <= FAST_MAX_CHARS and (norm in SMALL_TALK or not norm):
        return FAST
    if RECALL_CUES.search(text) or len(norm) >= FULL_MIN_CHARS:
        return FULL
    return MEDIUM
