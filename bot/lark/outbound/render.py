"""Lark message text: deterministic uuids, splitting long answers into chunks (never inside a
code fence, at a sentence end where one is near), and text vs ``post`` (Markdown) rendering."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from bot.lark.outbound.cards import fit_card_text

UUID_MAX = 50  # Lark's limit on the idempotency uuid of a message


def derive_uuid(base: str, *parts: object) -> str:
    """A deterministic uuid ``<base>-<part>-…`` (hashed when over Lark's 50 chars)."""
    joined = "-".join([base, *(str(p) for p in parts)])
    if len(joined) <= UUID_MAX:
        return joined
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:UUID_MAX]


TEXT_CHUNK_CHARS = 4000

_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"[。！？!?.;；](?=\s|$)|[。！？；]")


def _fence_after(piece: str, fence: str | None) -> str | None:
    """The code fence still open after ``piece`` (its opening line), or None."""
    for line in piece.split("\n"):
        if _FENCE.match(line):
            fence = None if fence is not None else line.strip()
    return fence


def _best_cut(window: str) -> int:
    """Where to cut ``window``: a paragraph, a line, a sentence, a space — or hard."""
    floor = len(window) // 2
    for sep in ("\n\n", "\n"):
        i = window.rfind(sep)
        if i >= floor:
            return i + len(sep)
    ends = [m.end() for m in _SENTENCE_END.finditer(window) if m.end() >= floor]
    if ends:
        return ends[-1]
    i = max(window.rfind(" "), window.rfind("\t"))
    if i >= floor:
        return i + 1
    return len(window)


def split_text(text: str, limit: int = TEXT_CHUNK_CHARS, *, max_bytes: int | None = None) -> list[str]:
    """Split ``text`` into readable chunks of at most ``limit`` chars (and ``max_bytes``).

    Cuts prefer paragraph, then line, then sentence, then word boundaries. A code
    fence open at a cut is closed at the end of the chunk and reopened at the start
    of the next, so each chunk renders on its own.
    """
    if limit < 64:
        raise ValueError("limit too small")

    def fits(s: str) -> bool:
        return len(s) <= limit and (max_bytes is None or len(s.encode("utf-8")) <= max_bytes)

    if fits(text):
        return [text]
    chunks: list[str] = []
    rest = text
    fence: str | None = None
    while rest:
        prefix = f"{fence}\n" if fence else ""
        if fits(prefix + rest):
            chunks.append(prefix + rest)
            break
        budget = limit - len(prefix) - 4  # room to close a fence with "\n```"
        window = rest[:budget]
        if max_bytes is not None:
            window = fit_card_text(window, max_bytes - len(prefix.encode("utf-8")) - 8)
        cut = _best_cut(window) or len(window) or 1
        piece = rest[:cut]
        rest = rest[cut:].lstrip("\n")
        new_fence = _fence_after(piece, fence)
        body = prefix + piece
        if new_fence:
            body = body.rstrip("\n") + "\n```"
        body = body.rstrip() if not new_fence else body
        if body.strip():
            chunks.append(body)
        fence = new_fence
    return chunks


# Indentation is [ \t]*, not \s*: \s* ran on across newlines, so each of n blank lines was
# scanned to the end of the text (quadratic: 6,000 newlines in an answer took 1.5 s on the loop).
_MARKDOWN = re.compile(
    r"(^[ \t]*(```|~~~))"              # code fence
    r"|(^#{1,6}\s+\S)"                 # heading
    r"|(^[ \t]*([-*+]|\d+[.)])\s+\S)"  # list item
    r"|(^[ \t]*>\s)"                   # quote
    r"|(\*\*[^*\n]+\*\*)"              # bold
    r"|(\[[^\]\n]+\]\([^)\s]+\))"      # link
    r"|(^\|.+\|\s*$)"                  # table row
    r"|(`[^`\n]+`)",                   # inline code
    re.M,
)


# Lark turns ``<at user_id="…">`` (text), ``<at id=…>`` / ``<at ids=…>`` / ``<at email=…>``
# (post md, card markdown) into real mentions, ``all`` included. Text the model wrote must never
# ping anyone: the tag's "<" becomes a full-width "＜", so it reads the same and mentions no one.
_AT_TAG = re.compile(r"<(\s*/?\s*at\b)", re.IGNORECASE)


def defuse_mentions(text: str) -> str:
    """``text`` with every ``<at …>`` / ``</at>`` tag made inert (only mentions the product
    itself adds are real; it adds them outside this text)."""
    return _AT_TAG.sub("＜\\1", text) if "<" in text else text


def looks_like_markdown(text: str) -> bool:
    return bool(_MARKDOWN.search(text))


LOCALES = {"zh": "zh_cn", "en": "en_us"}     # the user's language -> Lark's post locale


def render(text: str, locale: str = "zh_cn") -> tuple[str, dict[str, Any]]:
    """(msg_type, content) for one chunk: Markdown goes as a ``post`` with an ``md``
    paragraph (headings, lists, code render), under the user's ``locale`` (Lark shows a post
    by the reader's client language); plain prose as ``text``."""
    if looks_like_markdown(text):
        return "post", {locale: {"content": [[{"tag": "md", "text": text}]]}}
    return "text", {"text": text}
