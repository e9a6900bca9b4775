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

    from memory.text.tokenizer import search_terms     # jieba + stemmed English, as the episode index

    t = unicodedata.normalize("NFKC", text)
    return ({w for w in search_terms(t) if w.casefold() not in _COMMON and len(w) >= 2}
            | set(_DIGITS.findall(t)))


def material_texts(text: str) -> list[str]:
    """The bodies of the fenced material inside ``text`` (unescaped)."""
    return [html.unescape(m.group(2)) for m in FENCE.finditer(text)]


_OWN_TERMS_MAX = 4_000     # typed words up to this long are segmented; longer ones are searched


def _occurs(term: str, text: str) -> bool:
    """``term`` (a content word, stemmed) in ``text`` (NFKC, case-folded): a Latin or digit term
    at a word's start (its stem: "chines" in "chinese"), a Chinese one anywhere."""
    if term.isascii():
        return re.search(rf"(?<![a-z0-9]){re.escape(term)}", text) is not None
    return term in text


def taken_from_material(content: str, *, said: str, material: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The words of ``content`` (a fact or profile entry about to be written) that the turn's
    third-party material supplied and the user's own words (``said``) did not — empty when the
    write does not derive from material. Fences left in ``said`` count as material.

    Only ``content`` (at most a few hundred characters) is segmented; the material — a file of
    30,000 characters, tool results, the replayed turns' forwards — is searched for its words
    (C-speed substring search), so the check costs microseconds, not jieba's ~3 ms per 1,000
    characters on the event loop."""
    import unicodedata

    bodies = [*material, *material_texts(said)]
    if not content or not any(b.strip() for b in bodies):
        return ()
    words = _terms(content)
    if not words:
        return ()
    fold = lambda t: unicodedata.normalize("NFKC", t).casefold()  # noqa: E731
    own_text = strip(said)
    if len(own_text) <= _OWN_TERMS_MAX:
        own = _terms(own_text)
    else:
        folded = fold(own_text)
        own = {w for w in words if _occurs(w, folded)}
    folded_bodies = [fold(b) for b in bodies]
    return tuple(sorted(w for w in words - own if any(_occurs(w, b) for b in folded_bodies)))


# -- provenance: which parts of the turn were the user's ----------------------------------
#
# Word overlap with the material cannot catch what the model translated or paraphrased from it
# (a forwarded "Mallory" written to the profile as 马洛里). So the gate starts from provenance:
# a turn that carried no third-party material writes as before; in a turn that did (a fence, a
# tool's result, a transcript), a memory write must be *covered* by the words the user typed —
# every Latin word and number of it, and its Chinese characters but for a slip (喝 in "用户
# 喜欢喝咖啡" from "我喜欢咖啡"). Material says what the content may not take; the typed words
# say what it may: the second holds however the material was reworded.

def fenced(text: str) -> list[tuple[str, str]]:
    """(kind, unescaped text) of each fenced material in ``text``."""
    if "<untrusted_content" not in text:      # the common case, without a regex pass
        return []
    return [(dict(_ATTR.findall(m.group(1))).get("kind") or "material", html.unescape(m.group(2)))
            for m in FENCE.finditer(text)]


def material_kinds(text: str) -> set[str]:
    """The kinds (``forward``, ``file``, ``quoted``, ``group``, ``tool`` …) fenced in ``text``."""
    return {dict(_ATTR.findall(m.group(1))).get("kind") or "material" for m in FENCE.finditer(text)}


_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNIT = re.compile(rf"[{_CJK}]|[^\W\d_{_CJK}]+|\d+")
# how a model names the user in a memory it writes: not a word the user has to have typed
_SUBJECT = re.compile(r"该用户|用户|\bthe user'?s?\b|\busers?'?s?\b")
# characters that carry no content of their own (particles, pronouns): not counted either way
_FILLER = frozenset("的了着过是在和与及或把被让给对都也就还又很吗呢吧啊呀哦嗯么这那个我你您他她它们请")


def _units(text: str) -> tuple[set[str], set[str]]:
    """(CJK characters, other units — stemmed Latin words and digit runs) of ``text``."""
    import unicodedata

    from memory.text.tokenizer import STOP_EN, stem

    t = _SUBJECT.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    cjk, other = set(), set()
    for u in _UNIT.findall(t):
        if len(u) == 1 and re.match(f"[{_CJK}]", u):
            if u not in _FILLER:
                cjk.add(u)
        elif u.isdigit():
            other.add(u)
        elif u not in STOP_EN and len(u) > 1:
            other.add(stem(u))
    return cjk, other


def uncovered(content: str, *, said: str) -> tuple[str, ...]:
    """What of ``content`` the user's own words ``said`` do not cover — empty when they cover
    it: every Latin word (stemmed) and number of it is in ``said``, and all its Chinese
    characters but one in ten (at least one may differ: 喝, 名). A name, a number, an address
    or an instruction the user did not type is never covered, in whatever language the model
    wrote it."""
    cjk, other = _units(content)
    own_cjk, own_other = _units(said)
    missing_other = sorted(other - own_other)
    missing_cjk = [c for c in dict.fromkeys(_UNIT.findall(content)) if c in cjk and c not in own_cjk]
    if not missing_other and len(missing_cjk) <= max(1, len(cjk) // 10):
        return ()
    return (*missing_other, *missing_cjk)
