"""Text similarity that works for Chinese and English alike.

Character n-grams need no word segmentation, so one rule serves both scripts:
text is normalised (NFKC, case-folded, punctuation and spaces removed), cut into
character bigrams, and compared by Dice coefficient. Thresholds used by callers:
``SAME`` (>= 0.85) means "the same statement again"; ``RELATED`` (>= 0.5) means
"about the same thing" (merge/supersede candidates).
"""

from __future__ import annotations

import re
import unicodedata

SAME = 0.85
RELATED = 0.5

_STRIP = re.compile(r"[\s\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return _STRIP.sub("", text)


def bigrams(text: str) -> set[str]:
    n = normalise(text)
    if len(n) < 2:
        return {n} if n else set()
    return {n[i : i + 2] for i in range(len(n) - 1)}


def similarity(a: str, b: str) -> float:
    """Dice coefficient over character bigrams of the normalised texts (0..1)."""
    ga, gb = bigrams(a), bigrams(b)
    if not ga or not gb:
        return 1.0 if normalise(a) == normalise(b) else 0.0
    return 2 * len(ga & gb) / (len(ga) + len(gb))
