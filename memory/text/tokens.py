"""The token estimate: how many model tokens a text costs, without a tokenizer.

``estimate_tokens`` is the one estimate every budget of memory and the bot counts with —
working memory's ``replay_budget``, recall's ``RECALL_BUDGET_TOKENS`` and its heading and
evidence cuts (memory/episodes/evidence.py), the group context, the prompt-cache minimums.
Apart from the tokeniser (memory/text/tokenizer.py, the *words* a search sees) because it
answers another question, and in one place so that every budget counts alike: it counts high
(the safe side for a budget) and is fast (the ASCII case in C).
"""

from __future__ import annotations


def estimate_tokens(text: str) -> int:
    """A generous token estimate without a tokenizer: ASCII ~4 characters a token, anything
    else (CJK above all) one token a character. Used for budgets and the prompt-cache
    minimums, where counting high is the safe side."""
    if text.isascii():          # the common case, in C
        return (len(text) + 3) // 4
    # encode(…, "ignore") drops every non-ASCII character: the count in C, not per character
    ascii_chars = len(text.encode("ascii", "ignore"))
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)
