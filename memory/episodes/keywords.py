"""Episodes' words: the keywords of a summary and the words of a message.

What a text says in words, for the episode index and for recall: ``extract_keywords`` (an
episode's keywords), ``_clean_keywords`` (keywords given by a caller or an import), the
message's words with their sub-words (``_query_words``), whether it asks about a past
conversation (``RECALL_CUES``, ``has_recall_cue``) and whether it speaks of the user
(``_speaks_of_self``). Apart from the store and from recall because both read them, and
because they are pure functions of text (no database, no model).

Words
-----
The words come from the shared tokeniser (memory/text/tokenizer.py: jieba for Chinese, stop words
dropped, English lightly stemmed). ``extract_keywords(text, k=8)`` — at most ``k`` (≤ 8)
distinct words ranked by term frequency, ties broken by first appearance; ``search_terms`` /
``index_terms`` (the tokeniser's) are what the index stores and a search looks up.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

from memory.text.tokenizer import search_terms
from memory.text.tokenizer import stem as _stem, words as _words


MAX_KEYWORDS = 8
MAX_QUERY_TERMS = 32


def extract_keywords(text: str, k: int = MAX_KEYWORDS) -> list[str]:
    """At most ``k`` (≤ 8) keywords of ``text`` by term frequency, then first appearance."""
    k = max(0, min(int(k), MAX_KEYWORDS))
    words = _words(text)
    if not words or k == 0:
        return []
    counts = Counter(words)
    first: dict[str, int] = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    ranked = sorted(counts, key=lambda w: (-counts[w], first[w]))
    return ranked[:k]


def _query_words(text: str) -> list[tuple[str, set[str]]]:
    """The message's words (accurate mode, stemmed) each with its search-mode sub-words."""
    out: dict[str, set[str]] = {}
    for w in _words(text)[:MAX_QUERY_TERMS]:
        stem = _stem(w)
        if stem not in out:
            out[stem] = set(search_terms(w)) - {stem}
    return list(out.items())


# A message asking about the past in general ("还记得我们之前聊过的内容吗", "what did we talk
# about last time?"): recall falls back to the newest episodes when no content word decides.
RECALL_CUES = re.compile(
    r"(上次|上回|之前|以前|那次|还记得|记得吗|记不记得|聊过|说过|讨论过|提到过|提过|谈过|"
    r"last time|previously|earlier|remember|we talked|we discussed|talked about|you said|we spoke)",
    re.IGNORECASE,
)


def has_recall_cue(text: str) -> bool:
    return bool(RECALL_CUES.search(text or ""))


# English marks whom a question is about; a question about the user's own past says so.
_SELF_EN = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|our|ours|us)\b",
                      re.IGNORECASE)


_SELF_ZH = re.compile(r"[我咱俺]")


def _speaks_of_self(text: str) -> bool:
    """The message speaks of the user (semantic recall's condition; see SEMANTIC_GAP)."""
    return bool(_SELF_EN.search(text) or _SELF_ZH.search(text))


def _clean_keywords(keywords: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for kw in keywords:
        kw = " ".join(str(kw).split())[:40]
        if kw and kw not in out:
            out.append(kw)
        if len(out) >= MAX_KEYWORDS:
            break
    return out
