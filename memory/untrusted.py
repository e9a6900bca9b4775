"""Third-party material in stored turns: how memory recognises it.

Text that is not the speaker's own words (a forwarded message, a file's text, a quoted
message, a tool result) is stored inside the user's turn exactly as the model read it:
``<untrusted_content kind="…" source="…" author="…" time="…">escaped text</untrusted_content>``
(written by ``bot.agent.prompt.fence_material``). Its text and attributes are escaped, so the
material can neither close its fence nor forge one; a replay therefore shows it fenced, and
the consolidator finds it here: fact and profile extraction drop it (a fact about the user
comes from the user), transcripts mark it as third-party.
"""

from __future__ import annotations

import html
import re

TAG = "untrusted_content"

# attributes and body are escaped by the writer: no '>' inside the tag, no '<' in the body
FENCE = re.compile(r"<untrusted_content\b([^>]*)>(.*?)(?:</untrusted_content>|\Z)", re.DOTALL)
# (?<!\w): a name is tried from the start of its word only — a forged tag with a 20,000-character
# word was otherwise tried from each of its characters (quadratic, in the consolidator).
_ATTR = re.compile(r'(?<!\w)(\w+)="([^"]*)"')


def strip(text: str) -> str:
    """``text`` without any fenced material (what the speaker themselves wrote)."""
    return FENCE.sub("", text)


def _marked(m: re.Match, limit: int) -> str:
    attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group(1))}
    body = " / ".join(line.strip() for line in html.unescape(m.group(2)).splitlines() if line.strip())
    if len(body) > limit:
        body = body[:limit] + "…"
    by = f" written by {attrs['author']}" if attrs.get("author") else ""
    return (f"(third-party {attrs.get('kind', 'material')}{by} — shown by the speaker, "
            f"not the speaker's own words: {body})")


def mark_third_party(text: str, *, limit: int = 600) -> str:
    """``text`` with each fenced material replaced by one line saying it is third-party."""
    return FENCE.sub(lambda m: _marked(m, limit), text)


# -- writes the model derives from material ------------------------------------------------
#
# The consolidator never sees material (``strip`` above). The chat model does — it must, to
# answer about a forwarded CV — and it can call memory_write / profile_update with what it read
# there ("用户名叫张三" from a stranger's CV). Such a write is *refused*, not stored with a mark:
# a marked row would still be a fact in the user's memory (injected, listed, exported) that the
# user never said, and every reader would have to know the mark; a refusal returns to the model
# as an is_error result it can explain, and the user can still say it themselves.

_DIGITS = re.compile(r"\d{3,}")
# words a fact and a document share without the fact having come from it
_COMMON = frozenset("""用户 user 名字 名叫 叫 是 在 有 喜欢 讨厌 工作 住在 想 要 觉得 like love prefer hate
    work live is has have want name named call called""".split())


def _terms(text: str) -> set[str]:
    import unicodedata

    from memory.tokenizer import search_terms     # jieba + stemmed English, as the episode index

    t = unicodedata.normalize("NFKC", text)
    return ({w for w in search_terms(t) if w.casefold() not in _COMMON and len(w) >= 2}
            | set(_DIGITS.findall(t)))


def material_texts(text: str) -> list[str]:
    """The bodies of the fenced material inside ``text`` (unescaped)."""
    return [html.unescape(m.group(2)) for m in FENCE.finditer(text)]


def taken_from_material(content: str, *, said: str, material: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The words of ``content`` (a fact or profile entry about to be written) that the turn's
    third-party material supplied and the user's own words (``said``) did not — empty when the
    write does not derive from material. Fences left in ``said`` count as material."""
    bodies = [*material, *material_texts(said)]
    if not content or not any(b.strip() for b in bodies):
        return ()
    own = _terms(strip(said))
    seen = set().union(*(_terms(b) for b in bodies))
    return tuple(sorted((_terms(content) & seen) - own))
