"""The cold zone: durable facts about one user, each with a confidence.

Every fact belongs to exactly one user (``scope.user_id``, taken from the event, never from
model arguments) and every read filters ``user_id = ?`` in SQL. Facts learned in a p2p chat
are ``private`` (injected only in that user's p2p chats); facts learned in a group, and facts
the user enters in the console (``user_edit``), are ``shared``.

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

Outcome: if some active fact is the *same*, the best match is **reinforced** — confidence
``max(old, new)`` plus ``REINFORCE_STEP`` capped at ``MAX_REINFORCED`` (never lowered: a 1.0
user edit stays 1.0), ``hit_count + 1``, ``last_accessed``/``updated_at`` = now, provenance
(chat_id/message_id) kept where it was first learned and the new message added to its sources
(``fact_messages``: every message it was learned from, so a recall of one leaves it while
another remains — memory/governance/withdraw.py; issue 32), ``source`` upgraded to the
more authoritative (user_edit > agent_proactive > consolidator), visibility widened to ``shared``
when the fact is learned again outside p2p, content and category kept. Otherwise the new fact is
**added**. Either way every *contradicted* active fact is **superseded** — kept, with
``superseded_at`` = now and ``superseded_by`` = the surviving fact — never deleted; the new
fact keeps its own visibility (a p2p correction of a shared fact hides the old one in groups
without revealing the new one there).

Capacity: at most ``capacity`` active facts per user (default 500). When an add exceeds it, the
lowest-confidence facts, then the longest-unaccessed, then the oldest are deleted (superseded
history is not counted and not evicted); the fact being written is never evicted.

Injection: ``top(scope, k)`` returns active facts with confidence >= ``MIN_CONFIDENCE`` (0.3),
visible in the scope (outside p2p: ``shared`` only), by confidence DESC, last_accessed DESC,
id; served by the partial indexes ``facts_active`` / ``facts_active_shared``. With ``touch``
their ``last_accessed`` becomes now in one UPDATE. ``hit_count`` is *not* incremented by
injection: it counts re-learning (reinforcement), which is what the spec's 命中 stacks
confidence on; injection happens on every message and would drown it.
"""

from __future__ import annotations

import re
import time
import unicodedata
from difflib import SequenceMatcher
from functools import lru_cache
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from storage import Database, fetch_one, serialize, serialize_tx
from memory.queries import Query, answer, run
from memory.text.redact import looks_like_secret
from memory.scope import Scope
from memory.text.similarity import RELATED, SAME, dice, norm_bigrams, normalise

CATEGORIES = ("preference", "decision", "knowledge", "correction")
SOURCES = ("consolidator", "agent_proactive", "user_edit")
VISIBILITIES = ("private", "shared")
_AUTHORITY = {"consolidator": 0, "agent_proactive": 1, "user_edit": 2}

DEFAULT_CAPACITY = 500
MAX_CONTENT_CHARS = 500
MIN_CONFIDENCE = 0.3          # injection threshold
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


class FactError(ValueError):
    """Bad input to the fact store (a message suitable to show the caller or the model)."""


@dataclass(frozen=True, slots=True)
class Fact:
    id: int
    user_id: str
    content: str
    category: str
    confidence: float
    source: str
    visibility: str
    chat_id: str
    message_id: str
    created_at: float
    updated_at: float
    last_accessed: float
    hit_count: int
    superseded_at: float | None = None
    superseded_by: int | None = None

    @property
    def active(self) -> bool:
        return self.superseded_at is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FactWrite:
    fact: Fact
    action: str                          # added | reinforced | superseded
    superseded: tuple[int, ...] = ()     # ids this write superseded
    evicted: tuple[int, ...] = ()        # ids deleted to stay within capacity


_COLUMNS = (
    "id, user_id, content, category, confidence, source, visibility, chat_id, message_id, "
    "created_at, updated_at, last_accessed, hit_count, superseded_at, superseded_by"
)


def _fact(row: Any) -> Fact:
    return Fact(
        id=row["id"], user_id=row["user_id"], content=row["content"], category=row["category"],
        confidence=row["confidence"], source=row["source"], visibility=row["visibility"],
        chat_id=row["chat_id"], message_id=row["message_id"], created_at=row["created_at"],
        updated_at=row["updated_at"], last_accessed=row["last_accessed"],
        hit_count=row["hit_count"], superseded_at=row["superseded_at"],
        superseded_by=row["superseded_by"],
    )


# -- confidence -------------------------------------------------------------------------

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


# -- matching ---------------------------------------------------------------------------

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


# -- validation -------------------------------------------------------------------------

def clean_content(content: str) -> str:
    """One line, trimmed; ValueError (FactError) if empty, too long or a credential."""
    if not isinstance(content, str):
        raise FactError("fact content must be text")
    text = " ".join(content.split())
    if not text or not normalise(text):
        raise FactError("fact content is empty")
    if len(text) > MAX_CONTENT_CHARS:
        raise FactError(f"fact is too long ({len(text)} characters, at most {MAX_CONTENT_CHARS}); state it in one short sentence")
    if looks_like_secret(text):
        raise FactError("refused: this looks like a password, key or token; credentials are never stored in memory")
    return text


def _check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise FactError(f"unknown category {category!r}; use one of: {', '.join(CATEGORIES)}")
    return category


def _check_confidence(confidence: float) -> float:
    try:
        value = float(confidence)
    except (TypeError, ValueError):
        raise FactError(f"confidence must be a number between 0 and 1, not {confidence!r}") from None
    if not 0.0 <= value <= 1.0:
        raise FactError(f"confidence must be between 0 and 1, not {value}")
    return round(value, 4)


def top_query(scope: Scope, k: int) -> tuple[str, tuple[Any, ...]]:
    """The injection query: served in index order by ``facts_active`` (p2p) or
    ``facts_active_shared`` (elsewhere), no sort step (tests check the query plan)."""
    return (
        f"SELECT {_COLUMNS} FROM facts "
        f"WHERE user_id = ? AND superseded_at IS NULL AND confidence >= ? AND {scope.visible_sql()} "
        "ORDER BY confidence DESC, last_accessed DESC, id ASC LIMIT ?",
        (scope.user_id, MIN_CONFIDENCE, int(k)),
    )


def touch_top_query(scope: Scope, k: int, now: float) -> tuple[str, tuple[Any, ...]]:
    """Mark what ``top_query`` returns as accessed, in SQLite's dialect: an UPDATE of the ids
    the same query selects (run right after it in one write unit, so they are the same rows).
    ``+user_id`` keeps the owner filter but stops the planner from scanning the user's whole
    index instead of looking the ids up by rowid (the idiom wherever ids are listed)."""
    sql, params = top_query(scope, k)
    return (f"UPDATE facts SET last_accessed = ? WHERE +user_id = ? AND id IN (SELECT id FROM ({sql}))",
            (now, scope.user_id, *params))


def _row_sync(conn: Any, user_id: str, fact_id: int) -> Any:
    return conn.execute(f"SELECT {_COLUMNS}, norm FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)).fetchone()


def _top_and_touch_pg(scope: Scope, k: int, now: float) -> tuple[str, tuple[Any, ...]]:
    """``top_query`` and the touch of what it returns as one PostgreSQL statement: a
    data-modifying CTE (a write unit would be three round trips: SELECT, UPDATE, COMMIT). The
    outer SELECT reads the snapshot before the UPDATE, so the rows come back as found."""
    sql, params = top_query(scope, k)
    return (f"WITH top AS ({sql}), touched AS (UPDATE facts SET last_accessed = ?"
            " WHERE user_id = ? AND id IN (SELECT id FROM top))"
            " SELECT * FROM top ORDER BY confidence DESC, last_accessed DESC, id ASC",
            (*params, now, scope.user_id))


class FactStore:
    def __init__(
        self,
        db: Database,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.db = db
        self.capacity = capacity
        self.clock = clock

    # -- writing ----------------------------------------------------------------------
    async def add(
        self,
        scope: Scope,
        content: str,
        category: str,
        *,
        source: str,
        confidence: float | None = None,
        user_text: str = "",
        importance: float | None = None,
        session_id: str = "",
        decision: tuple[str, int | None] | None = None,
    ) -> FactWrite:
        """Learn a fact for ``scope.user_id``: add, reinforce, and/or supersede (module docs).

        ``session_id``: the session it was learned from (recorded in ``fact_sources``, so
        deleting that session removes the facts learned only from it). ``decision``: the
        extraction model's (action, target id) — ``reinforce`` / ``update`` / ``contradict`` an
        active fact of this user it was shown, applied as given; ``add`` (or a target that is
        not an active fact of the user) falls back to the string rules above."""
        if not scope.user_id:
            raise FactError("no user to store the fact for")
        text = clean_content(content)
        _check_category(category)
        if source not in SOURCES:
            raise FactError(f"unknown source {source!r}; use one of: {', '.join(SOURCES)}")
        if confidence is not None:
            conf = _check_confidence(confidence)
        else:
            conf = initial_confidence(source, user_text=user_text, importance=importance)
        visibility = "shared" if source == "user_edit" else scope.new_visibility
        new = _analyse(text)
        now = self.clock()

        # The whole read-compare-write runs as one Database.write in the SQLite thread (one
        # round trip instead of up to ten; the remember tool calls this on the reply path).
        return await self.db.write(self._add_sync, scope, text, category, source, conf, visibility, new, now,
                                   session_id, decision)

    def _add_sync(self, conn: Any, scope: Scope, text: str, category: str, source: str, conf: float,
                  visibility: str, new: Any, now: float, session_id: str = "",
                  decision: tuple[str, int | None] | None = None) -> FactWrite:
        user = scope.user_id
        serialize(conn, "user", user)    # the match, supersede and evict read all the user's facts
        rows = conn.execute(
            "SELECT id, content, confidence FROM facts WHERE user_id = ? AND superseded_at IS NULL", (user,)
        ).fetchall()

        same: list[tuple[float, float, int]] = []
        contradicted: list[int] = []
        action_of_model, target = decision or ("add", None)
        active_ids = {r["id"]: r for r in rows}
        if action_of_model != "add" and target in active_ids:
            # the model saw this fact and decided: apply it as given (no string rules)
            if action_of_model == "reinforce":
                same = [(1.0, active_ids[target]["confidence"], target)]
            else:                      # update | contradict: the new fact replaces it
                contradicted = [target]
            rows = []
        for row in rows:
            kind, score = _relation(new, _analyse(row["content"]), category)
            if kind == SAME_FACT:
                same.append((score, row["confidence"], row["id"]))
            elif kind == CONTRADICTS:
                contradicted.append(row["id"])

        evicted: tuple[int, ...] = ()
        if same:
            target_id = max(same)[2]
            old = _row_sync(conn, user, target_id)
            assert old is not None
            new_conf = reinforced_confidence(old["confidence"], conf)
            new_source = source if _AUTHORITY[source] > _AUTHORITY[old["source"]] else old["source"]
            new_vis = "shared" if visibility == "shared" else old["visibility"]
            # Provenance stays where the fact was first learned; this learning is one more row
            # of fact_messages (below): a recall of either message leaves the other's (issue 32).
            chat_id, message_id = old["chat_id"], old["message_id"]
            if not message_id and scope.message_id:
                chat_id, message_id = scope.chat_id, scope.message_id
            conn.execute(
                "UPDATE facts SET confidence = ?, source = ?, visibility = ?, chat_id = ?, "
                "message_id = ?, hit_count = hit_count + 1, last_accessed = ?, updated_at = ? "
                "WHERE user_id = ? AND id = ?",
                (new_conf, new_source, new_vis, chat_id, message_id, now, now, user, target_id),
            )
            fact_id, action = target_id, "reinforced"
        else:
            fact_id = int(conn.execute(
                "INSERT INTO facts(user_id, content, norm, category, confidence, source, "
                "visibility, chat_id, message_id, created_at, updated_at, last_accessed, hit_count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (user, text, new.norm, category, conf, source, visibility,
                 scope.chat_id, scope.message_id, now, now, now),
            ).lastrowid)
            action = "superseded" if contradicted else "added"

        if session_id:
            conn.execute("INSERT OR IGNORE INTO fact_sources(fact_id, session_id) VALUES (?, ?)",
                         (fact_id, session_id))
        if scope.message_id:
            conn.execute("INSERT OR IGNORE INTO fact_messages(fact_id, message_id, chat_id, visibility, learned_at)"
                         " VALUES (?, ?, ?, ?, ?)", (fact_id, scope.message_id, scope.chat_id, visibility, now))
        if category == "correction" and action == "added" and not contradicted and rows and decision is None:
            # memory_write {category: correction} states what replaces an earlier fact: the
            # one it corrects is the closest on the words it negates (其实我不在杭州 → 用户在杭州工作)
            target = corrected_fact(text, [(r["id"], r["content"]) for r in rows])
            if target is not None:
                contradicted = [target]
                action = "superseded"
        contradicted = [i for i in contradicted if i != fact_id]
        if contradicted:
            marks = ",".join("?" * len(contradicted))
            conn.execute(
                f"UPDATE facts SET superseded_at = ?, superseded_by = ?, updated_at = ? "
                f"WHERE +user_id = ? AND superseded_at IS NULL AND id IN ({marks})",
                (now, fact_id, now, user, *contradicted),
            )
        if action != "reinforced":
            evicted = self._evict_sync(conn, user, keep=fact_id)
        row = _row_sync(conn, user, fact_id)
        assert row is not None
        return FactWrite(_fact(row), action, tuple(contradicted), evicted)

    async def similar(self, user_id: str, texts: list[str], k: int = 10) -> list[tuple[int, str]]:
        """The user's active facts most similar to ``texts`` (what extraction is shown to decide
        add / reinforce / update / contradict): by shared content words, then character bigrams."""
        rows = await self.db.fetchall(
            "SELECT id, content FROM facts WHERE user_id = ? AND superseded_at IS NULL ORDER BY id", (user_id,))
        if not rows:
            return []
        said = [_analyse(t[:MAX_CONTENT_CHARS]) for t in texts if t.strip()]
        words = frozenset().union(*(a.words for a in said)) if said else frozenset()
        grams = set().union(*(a.grams for a in said)) if said else set()
        scored = []
        for r in rows:
            a = _analyse(r["content"])
            shared = len(a.words & words)
            score = (shared, dice(a.grams, grams) if grams else 0.0)
            if shared or score[1] >= RELATED / 2:
                scored.append((score, r["id"], r["content"]))
        scored.sort(key=lambda x: (-x[0][0], -x[0][1], x[1]))
        return [(i, c) for _, i, c in scored[:k]]

    def _evict_sync(self, conn: Any, user_id: str, *, keep: int) -> tuple[int, ...]:
        (active,) = conn.execute(
            "SELECT COUNT(*) FROM facts WHERE user_id = ? AND superseded_at IS NULL", (user_id,)
        ).fetchone()
        excess = active - self.capacity
        if excess <= 0:
            return ()
        ids = tuple(r[0] for r in conn.execute(
            "SELECT id FROM facts WHERE user_id = ? AND superseded_at IS NULL AND id != ? "
            "ORDER BY confidence ASC, last_accessed ASC, id ASC LIMIT ?",
            (user_id, keep, excess),
        ).fetchall())
        if ids:
            marks = ",".join("?" * len(ids))
            conn.execute(f"DELETE FROM facts WHERE +user_id = ? AND id IN ({marks})", (user_id, *ids))
        return ids

    @staticmethod
    async def _row(conn: Any, user_id: str, fact_id: int) -> Any:
        return await fetch_one(conn, f"SELECT {_COLUMNS}, norm FROM facts WHERE user_id = ? AND id = ?",
                               (user_id, fact_id))

    async def update(
        self,
        user_id: str,
        fact_id: int,
        *,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
        visibility: str | None = None,
    ) -> Fact | None:
        """The user's own edit (console): in place, source becomes ``user_edit``.

        New content without an explicit confidence sets confidence to 1.0 (the user said so).
        Returns None when the user has no such fact.
        """
        sets: dict[str, Any] = {}
        if content is not None:
            text = clean_content(content)
            sets.update(content=text, norm=normalise(text))
            if confidence is None:
                sets["confidence"] = USER_EDIT_CONFIDENCE
        if category is not None:
            sets["category"] = _check_category(category)
        if confidence is not None:
            sets["confidence"] = _check_confidence(confidence)
        if visibility is not None:
            if visibility not in VISIBILITIES:
                raise FactError(f"unknown visibility {visibility!r}; use private or shared")
            sets["visibility"] = visibility
        if not sets:
            return await self.get(user_id, fact_id)
        sets.update(source="user_edit", updated_at=self.clock())
        assignments = ", ".join(f"{k} = ?" for k in sets)
        async with self.db.transaction() as tx:
            await serialize_tx(tx, "user", user_id)   # not between an add's read and its write
            cur = await tx.execute(
                f"UPDATE facts SET {assignments} WHERE user_id = ? AND id = ?",
                (*sets.values(), user_id, fact_id),
            )
            changed = cur.rowcount
            await cur.close()
            row = await self._row(tx, user_id, fact_id) if changed else None
        return _fact(row) if row else None

    async def delete(self, user_id: str, fact_id: int) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id))
            n = cur.rowcount
            await cur.close()
        return n > 0

    async def delete_all(self, user_id: str) -> int:
        """Every fact of the user, superseded history included."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM facts WHERE user_id = ?", (user_id,))
            n = cur.rowcount
            await cur.close()
        return n

    # -- reading ----------------------------------------------------------------------
    async def top(self, scope: Scope, k: int = 15, *, touch: bool = True) -> list[Fact]:
        """The facts to inject for this request (module docs); fast path uses k=5."""
        return await run(self.db, self.top_read(scope, k, touch=touch))

    def top_read(self, scope: Scope, k: int = 15, *, touch: bool = True) -> Query[list[Fact]]:
        """``top`` as a Query (memory/queries.py): with ``touch``, what it returns is marked
        accessed in the same round trip — on every message, so never a unit of its own."""
        if k <= 0 or not scope.user_id:
            return answer([])
        if not touch:
            return Query((top_query(scope, k),), lambda rows: [_fact(r) for r in rows[0]])
        now = self.clock()

        def touched(rows: list[list[Any]]) -> list[Fact]:
            return [replace(_fact(r), last_accessed=now) for r in rows[0]]
        if self.db.dialect == "postgres":
            return Query((_top_and_touch_pg(scope, k, now),), touched, writes=True)
        return Query((top_query(scope, k), touch_top_query(scope, k, now)), touched, writes=True)

    async def get(self, user_id: str, fact_id: int) -> Fact | None:
        row = await self.db.fetchone(
            f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND id = ?", (user_id, fact_id)
        )
        return _fact(row) if row else None

    async def sources(self, user_id: str, fact_ids: list[int]) -> dict[int, list[tuple[str, str, float]]]:
        """Every message each fact was learned from: {fact_id: [(chat_id, message_id, learned_at)]},
        oldest first (facts of ``user_id`` only; ids without a row are absent)."""
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        rows = await self.db.fetchall(
            "SELECT m.fact_id, m.chat_id, m.message_id, m.learned_at FROM fact_messages m"
            f" JOIN facts f ON f.id = m.fact_id WHERE f.user_id = ? AND m.fact_id IN ({marks})"
            " ORDER BY m.learned_at, m.message_id", (user_id, *fact_ids))
        out: dict[int, list[tuple[str, str, float]]] = {}
        for r in rows:
            out.setdefault(int(r["fact_id"]), []).append((r["chat_id"], r["message_id"], r["learned_at"]))
        return out

    async def list(self, user_id: str, *, include_superseded: bool = False) -> list[Fact]:
        """Active facts by rank; with history, superseded ones follow, newest first."""
        active = [
            _fact(r)
            for r in await self.db.fetchall(
                f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND superseded_at IS NULL "
                "ORDER BY confidence DESC, last_accessed DESC, id ASC",
                (user_id,),
            )
        ]
        if not include_superseded:
            return active
        history = await self.db.fetchall(
            f"SELECT {_COLUMNS} FROM facts WHERE user_id = ? AND superseded_at IS NOT NULL "
            "ORDER BY superseded_at DESC, id DESC",
            (user_id,),
        )
        return active + [_fact(r) for r in history]

    async def count(self, user_id: str, *, include_superseded: bool = False) -> int:
        sql = "SELECT COUNT(*) AS n FROM facts WHERE user_id = ?"
        if not include_superseded:
            sql += " AND superseded_at IS NULL"
        row = await self.db.fetchone(sql, (user_id,))
        return int(row["n"]) if row else 0


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
