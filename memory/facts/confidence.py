"""How confident a newly learned fact starts, and how re-learning it raises that.

Apart from the store because it is pure policy (no SQL): the numbers of the spec's bands and
the strong signals in the user's own words, used by ``FactStore.add`` and by the tools that
look for those signals before a fact is written.

Confidence on ``add`` (an explicit ``confidence=`` argument, 0..1, always wins — imports use it):

* ``user_edit`` 1.0; ``agent_proactive`` (the ``memory_write`` tool) 0.95;
* ``consolidator``: the spec's bands, scaled by ``importance`` (the extractor's 0..1 score,
  which its prompt anchors at 0.8 for an ordinary fact, 0.9–0.95 for a strong signal):
  - ordinary (importance below 0.9, or none given): **0.8** — an importance under 0.8 scales
    it down linearly to 0.7 at ``MIN_IMPORTANCE`` (a fact the extractor itself doubts ranks
    below the ones it does not), never above 0.8;
  - strong (importance 0.9–0.95, the spec's 强信号加权): **0.9–0.95**, importance itself,
    capped at 0.95; also ``user_text`` (the user's own words the fact came from) containing one
    of ``STRONG_SIGNALS`` (记住 / 别忘 / 纠正 / 偏好 / 一定要 / 务必 / 永远 / 以后都 …, remember /
    don't forget / correct / prefer / always / never / make sure / from now on …) → 0.9, two or
    more different ones → 0.95. The highest of these applies.
"""

from __future__ import annotations

import re

EXTRACTED_CONFIDENCE = 0.8    # consolidator default (the ordinary band's top)
ORDINARY_FLOOR = 0.7          # the ordinary band's bottom, at MIN_IMPORTANCE
MIN_IMPORTANCE = 0.3          # below it the queue keeps no fact at all
ORDINARY_IMPORTANCE = 0.8     # the extractor's score for an ordinary durable fact
STRONG_IMPORTANCE = 0.9       # the extractor's score for a strong signal
STRONG_CONFIDENCE = 0.9       # one strong signal / importance 0.9
STRONGEST_CONFIDENCE = 0.95   # two strong signals / importance >= 0.95
PROACTIVE_CONFIDENCE = 0.95   # memory_write
USER_EDIT_CONFIDENCE = 1.0
REINFORCE_STEP = 0.05
MAX_REINFORCED = 0.99

# Strong signals in the user's words: each entry is one signal (counted once).
STRONG_SIGNALS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("记住", r"记住|记得|记一下|记下来"),
        ("别忘", r"别忘|不要忘|千万别忘"),
        ("纠正", r"纠正|更正|说错了|搞错了"),
        ("偏好", r"偏好|更喜欢|最喜欢"),
        ("一定", r"一定要|务必|千万|必须"),
        ("永远", r"永远|始终|一直都|以后都|从今以后|绝对不|绝不|从不"),
        ("remember", r"\bremember\b|\bmake a note\b"),
        ("forget", r"\bdon['’]?t forget\b|\bdo not forget\b|\bnever forget\b"),
        ("correct", r"\bcorrect(?:ion)?\b|\bthat['’]?s wrong\b|\bi meant\b"),
        ("prefer", r"\bprefer(?:s|red|ence)?\b"),
        ("always", r"\balways\b|\bnever\b|\bfrom now on\b"),
        ("must", r"\bmake sure\b|\bmust\b|\bbe sure to\b"),
    )
)


def strong_signals(user_text: str) -> list[str]:
    """Names of the strong signals present in the user's words."""
    if not user_text:
        return []
    return [name for name, pattern in STRONG_SIGNALS if pattern.search(user_text)]


def initial_confidence(source: str, *, user_text: str = "", importance: float | None = None) -> float:
    """The confidence a newly learned fact starts with (see the module docstring)."""
    if source == "user_edit":
        return USER_EDIT_CONFIDENCE
    if source == "agent_proactive":
        return PROACTIVE_CONFIDENCE
    conf = EXTRACTED_CONFIDENCE
    if importance is not None:
        imp = min(1.0, max(0.0, float(importance)))
        if imp >= STRONG_IMPORTANCE:
            conf = min(STRONGEST_CONFIDENCE, imp)
        elif imp < ORDINARY_IMPORTANCE:
            share = max(0.0, imp - MIN_IMPORTANCE) / (ORDINARY_IMPORTANCE - MIN_IMPORTANCE)
            conf = ORDINARY_FLOOR + (EXTRACTED_CONFIDENCE - ORDINARY_FLOOR) * share
    n = len(strong_signals(user_text))
    if n >= 2:
        conf = max(conf, STRONGEST_CONFIDENCE)
    elif n == 1:
        conf = max(conf, STRONG_CONFIDENCE)
    return round(conf, 4)


def reinforced_confidence(old: float, new: float) -> float:
    base = max(old, new)
    return round(max(base, min(MAX_REINFORCED, base + REINFORCE_STEP)), 4)
