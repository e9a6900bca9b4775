"""Whether a new fact is the same as, contradicts, or is unrelated to one the user already has.

Apart from the store because it is pure text analysis (no SQL, no I/O): negations, change
markers, numbers, the people a fact names, content words. ``FactStore.add`` applies it to
each active fact; the offline model and the procedures store use ``relation`` too.

Matching a new fact against the user's active facts (one pass, in ``add``). Texts are compared
twice: as written (``similarity.normalise`` + bigram Dice), and as a *skeleton* — with negation
words (不/没/别/未/不再/没有…, not/no/never/n't/no longer…), change markers (现在/目前/如今/
已经/改为/改成/换成/其实/以后…, now/currently/anymore/instead/actually/from now on…) and the
particles 了/啦 removed, and every number replaced by ``#``. For an existing fact ``old`` and the new text ``new``:

1. *same text*: normalised texts equal                                  → same fact;
2. *negation*: the two differ in polarity (exactly one contains a negation word), and either
   their skeletons are the same (Dice >= ``SAME``), or ``new`` contains a change marker and the
   skeletons are related (Dice >= ``RELATED``)                          → contradiction;
   otherwise a negated new fact is unrelated: "用户不喜欢喝茶了" never supersedes "用户喜欢喝咖啡";
3. *near-identical* (Dice >= ``SAME`` as written or as skeletons): both contain numbers and the
   numbers differ (跑步5公里 → 跑步10公里)                                → contradiction;
   they differ only by added or dropped words ("in all editors" / "in all the editors") → same
   fact; they differ by a *substitution* (difflib ``replace`` on the skeletons: 后端→前端,
   女儿→儿子, Bob→Alice) → a different statement, never the same fact: go on to rule 4;
4. *update*: ``new`` is a ``correction`` or contains a change marker, and the skeletons are
   related (Dice >= ``RELATED``)                                        → contradiction;
5. otherwise unrelated (both kept: "用户喜欢喝茶" and "用户喜欢喝咖啡" can both be true).

Numbers are ASCII digits after NFKC (Chinese numerals are compared as text). Bigram Dice cannot
tell "the same fact reworded" from "one word changed" in a long sentence, so a substitution is
never reinforcement (that would silently drop the new value) and, without a correction or a
change marker, not a contradiction either (both kept: the user may have a daughter *and* a son
at 北京大学); a later correction resolves it.
"""

from __future__ import annotations

import re
import unicodedata
from difflib import SequenceMatcher
from functools import lru_cache
from dataclasses import dataclass

from memory.text.similarity import RELATED, SAME, dice, norm_bigrams, normalise

_NEG_EN = re.compile(
    r"\b(?:no longer|not|no|never|none|nothing|nobody|neither|nor|cannot)\b"
    r"|\b(?:do|does|did|is|are|was|were|has|have|had|ca|wo|could|would|should)n['’]?t\b"
    r"|\b(?:don|won|can|isn|aren|doesn|didn)['’]t\b"
    r"|\bdis(?=lik)",
    re.IGNORECASE,
)
# Chinese words that contain a negation character without negating anything.
_NEG_CN_NOT = re.compile(
    r"(不错|不过|不少|不仅|不同|不断|不管|不久|不得不|差不多|要不|别人|特别|区别|类别|级别|分别|性别|"
    r"识别|告别|未来|非常|无论|无聊)"
)
_NEG_CN = re.compile(r"不再|从不|从未|并不|并非|没有|不|没|别|未|无")
_CHANGE_EN = re.compile(
    r"\b(?:now|currently|these days|nowadays|anymore|any more|instead|actually|from now on|no longer)\b",
    re.IGNORECASE,
)
_CHANGE_CN = re.compile(r"现在|目前|如今|最近|已经|改为|改成|换成|改用|其实|实际上|以后|从今以后|不再")
_PARTICLES = re.compile(r"了|啦")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True, slots=True)
class _Text:
    norm: str
    grams: set[str]
    skeleton: str
    skeleton_grams: set[str]
    negated: bool
    numbers: tuple[str, ...]
    changed: bool = False
    words: frozenset[str] = frozenset()
    others: frozenset[str] = frozenset()     # the other people the fact names (_others)


def _negated(text: str) -> bool:
    if _NEG_EN.search(text):
        return True
    return bool(_NEG_CN.search(_NEG_CN_NOT.sub("", text)))


# Ways of saying "is named" that say the same thing (issue 31): one form before comparing, so
# "a dog named Max" / "a dog called Max" and 的女儿叫 / 女儿的名字叫 are one fact.
_NAMING = ((re.compile(r"\b(?:is\s+)?(?:called|named|whose\s+name\s+is)\b", re.I), "named"),
           (re.compile(r"的?名字(?:叫做|叫|是)|名叫|叫做"), "叫"))


# Words naming someone other than the user (issue 31): a fact about a relative or a colleague
# is never the user's own — "用户的手机号" / "用户母亲的手机号", "lives in Hangzhou" / "her
# sister lives in Hangzhou" — so two facts naming different people are two facts.
_OTHERS_ZH = re.compile("|".join(sorted("""母亲 妈妈 父亲 爸爸 父母 爸妈 姐姐 妹妹 哥哥 弟弟 女儿 儿子 丈夫 老公 妻子 老婆
    太太 先生 男朋友 女朋友 对象 朋友 同事 老板 领导 上司 孩子 爷爷 奶奶 外公 外婆 姥姥 姥爷 叔叔 阿姨 舅舅 姑姑
    表哥 表姐 表弟 表妹 堂哥 堂姐 室友 邻居 同学 老师 导师 岳父 岳母 公公 婆婆 侄子 侄女 外甥 宝宝""".split(),
                                        key=len, reverse=True)))
_OTHERS_EN = re.compile(r"\b(mother|mom|mum|father|dad|parents?|sisters?|brothers?|daughters?|sons?|husband|wife|"
                        r"boyfriend|girlfriend|partner|friends?|colleagues?|coworkers?|co-workers?|boss|manager|"
                        r"kids?|child|children|grandmother|grandfather|grandma|grandpa|uncle|aunt|cousin|"
                        r"roommate|flatmate|neighbou?r|classmate|teacher|in-laws?|nephew|niece|baby)\b", re.I)


def _others(text: str) -> frozenset[str]:
    found = {m.group(0) for m in _OTHERS_ZH.finditer(text)}
    found |= {m.group(1).casefold().rstrip("s") for m in _OTHERS_EN.finditer(text)}
    return frozenset(found)


def _canonical(text: str) -> str:
    for pattern, form in _NAMING:
        text = pattern.sub(form, text)
    return text


@lru_cache(maxsize=2048)   # ~11 KB an entry: a few users at default capacity
def _analyse(text: str) -> _Text:
    """Everything matching needs about one text (pure; cached, facts are compared repeatedly)."""
    text = _canonical(text)
    t = unicodedata.normalize("NFKC", text).casefold()
    norm = normalise(text)
    skel = _CHANGE_EN.sub(" ", t)
    skel = _NEG_EN.sub(" ", skel)
    # drop Chinese negations and change markers, but not inside words like 不错/非常/别人
    parts = _NEG_CN_NOT.split(skel)
    parts[::2] = [_PARTICLES.sub("", _CHANGE_CN.sub("", _NEG_CN.sub("", p))) for p in parts[::2]]
    skel = normalise(_NUMBER.sub("#", "".join(parts)))
    return _Text(
        norm=norm,
        grams=norm_bigrams(norm),
        skeleton=skel,
        skeleton_grams=norm_bigrams(skel),
        negated=_negated(t),
        numbers=tuple(_NUMBER.findall(t)),
        changed=bool(_CHANGE_EN.search(t) or _CHANGE_CN.search(t)),
        words=_content_words(text),
        others=_others(t),
    )


_ORDINAL = re.compile(r"第\s*\d|\bno\.?\s*\d|#\s*\d|\d+\s*号", re.I)
# predicate words two facts share without being about one thing (喜欢咖啡 / 不喜欢茶)
_PREDICATES = frozenset("""喜欢 不喜欢 讨厌 工作 住在 是 在 有 想 要 觉得 like love prefer hate work live
    is has have want""".split())
_DEGREE = frozenset({"很", "非常", "特别", "十分", "挺", "最", "真", "一名", "一位", "一个", "名"})


def _content_words(text: str) -> frozenset[str]:
    """The fact's content words (jieba + stemmed English, as the episode index has them),
    without the subject and degree words: "用户很喜欢喝乌龙茶" ~ "用户喜欢喝乌龙茶"."""
    from memory.text.tokenizer import search_terms

    return frozenset(w for w in search_terms(text) if w not in ("用户", "user") and w not in _DEGREE)


SAME_FACT, CONTRADICTS, UNRELATED = "same", "contradicts", "unrelated"


def relation(new: str, old: str, *, category: str = "knowledge") -> str:
    """How a new fact text relates to an existing one: same / contradicts / unrelated."""
    return _relation(_analyse(new), _analyse(old), category)[0]


def _substituted(a: str, b: str) -> bool:
    """True when turning ``a`` into ``b`` replaces something (not only adds or removes)."""
    return any(op == "replace" for op, *_ in SequenceMatcher(None, a, b, autojunk=False).get_opcodes())


def _relation(new: _Text, old: _Text, category: str) -> tuple[str, float]:
    if new.norm == old.norm:
        return SAME_FACT, 1.0
    raw = dice(new.grams, old.grams)
    if new.others != old.others:
        return UNRELATED, raw          # about different people (the user vs a relative)
    skel = dice(new.skeleton_grams, old.skeleton_grams)
    if new.negated != old.negated:
        if skel >= SAME or (new.changed and skel >= RELATED):
            return CONTRADICTS, skel
        return UNRELATED, raw
    correcting = category == "correction" or new.changed
    # (not with a negation: which of the words it negates is what the order says —
    # 用简体，不要繁体 / 用繁体，不要简体 have the same words)
    if (not correcting and not new.negated and new.numbers == old.numbers and new.words and old.words
            and (new.words == old.words
                 or (min(len(new.words), len(old.words)) >= 2 and (new.words <= old.words or old.words <= new.words)
                     and not _substituted(old.skeleton, new.skeleton)))):
        # the same content words, one a restatement or refinement of the other (word order,
        # 很/非常, "before work" added): the same fact re-learned, reinforced
        return SAME_FACT, max(raw, skel)
    if raw >= SAME or skel >= SAME:
        if new.numbers and old.numbers and new.numbers != old.numbers:
            # an ordinal names another thing (第1号/第2号邮票, No. 3 / No. 4) unless it says it
            # changed; a quantity or a date replaces the old value (3月5日 → 3月6日)
            if not correcting and _ORDINAL.search(new.norm) and _ORDINAL.search(old.norm):
                return UNRELATED, max(raw, skel)
            return CONTRADICTS, max(raw, skel)
        if not _substituted(old.skeleton, new.skeleton):
            return SAME_FACT, max(raw, skel)
        # a word was substituted (后端→前端, Bob→Alice): a different statement, see rule 4
    if (category == "correction" or new.changed) and skel >= RELATED:
        return CONTRADICTS, skel
    return UNRELATED, raw


_NEGATION_WORDS = re.compile(r"(?:不是|不在|不住|不再|没有|并非|而不是|不|没|\bnot\b|\bno longer\b|n't)\s*(\S{1,20})", re.I)


def corrected_fact(correction: str, facts: list[tuple[int, str]]) -> int | None:
    """Which of the user's facts a correction replaces: among those sharing a content word
    with it, the one sharing the words it negates ("不在杭州", "not in Berlin") first, then the
    one sharing most words; None when no fact shares a word (nothing to correct)."""
    from memory.text.tokenizer import search_terms    # jieba: loaded once, shared with the episode index

    boring = {"用户", "user"}
    words = set(search_terms(correction)) - boring
    if not words:
        return None
    negated: set[str] = set()
    for m in _NEGATION_WORDS.finditer(correction):
        negated |= set(search_terms(m.group(1))) - boring
    best: tuple[int, int, int] | None = None
    for fid, content in facts:
        shared = words & set(search_terms(content))
        if not shared - _PREDICATES:
            continue
        key = (len(shared & negated), len(shared), fid)
        if best is None or key > best:
            best = key
    if best is None or (negated and best[0] == 0 and best[1] < 2):
        return None
    return best[2]
