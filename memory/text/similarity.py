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


def norm_bigrams(norm: str) -> set[str]:
    """Bigrams of an already normalised text (a one-character text is its own gram)."""
    if len(norm) < 2:
        return {norm} if norm else set()
    return {norm[i : i + 2] for i in range(len(norm) - 1)}


def bigrams(text: str) -> set[str]:
    return norm_bigrams(normalise(text))


def dice(ga: set[str], gb: set[str]) -> float:
    """Dice coefficient of two bigram sets; two empty sets are equal (1.0)."""
    if not ga or not gb:
        return 1.0 if ga == gb else 0.0
    return 2 * len(ga & gb) / (len(ga) + len(gb))


def similarity(a: str, b: str) -> float:
    """Dice coefficient over character bigrams of the normalised texts (0..1)."""
    return dice(bigrams(a), bigrams(b))
