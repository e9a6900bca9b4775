"""The shared tokeniser: the words of a text, as memory's search and keywords see them.

One module for every layer that needs words (episodes' index and recall, facts' search and
duplicate check, the admin tools that rewrite an index): the same words on both sides of a
search, whatever store asks.

Chinese is segmented with jieba (its own ``Tokenizer`` instance, loaded lazily once;
``warm_up()`` loads it ahead of time, off the reply path — about half a second to a second,
holding the interpreter lock most of it). English is split into words. Both are NFKC-folded
and lower-cased; stop words (the small lists below, plus the boiler-plate of model-written
summaries: 用户, 助手, user, assistant, discussed …), single characters (but the topic nouns
of ``KEEP_SINGLE_ZH``) and bare numbers are dropped.

* ``words(text)`` — content words in order of appearance (jieba's accurate mode);
  ``words(text, search=True)`` jieba's search mode (a long word also yields its sub-words:
  睡不着 → 不着, 睡不着).
* ``stem(word)`` — a light English suffix stripper (deploying/deployed → deploy).
* ``search_terms(text)`` — the distinct stemmed search-mode words, in order.
* ``index_terms(text)`` — the same with their repeats (term frequency, for BM25).
* ``is_common_zh(word)`` — among the commonest words of the language (jieba's counts).
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from typing import Any

COMMON_ZH_COUNT = 20_000   # jieba's dictionary count (of ~60 M words) above which a Chinese word is
                           # among the ~150 commonest of the language (公司 45 604, 工作, 时间, 城市)

# --- stop words -------------------------------------------------------------------------

STOP_ZH = frozenset(
    """
    的 了 着 过 是 在 有 和 与 及 或 但 而 把 被 让 给 对 从 到 向 为 以 之 于 上 下 中 里 也 都
    就 还 又 再 才 很 太 更 最 吗 呢 吧 啊 呀 哦 嗯 哈 嘛 啦 么 个 这 那 哪 谁 我 你 您 他 她 它 们
    我们 你们 您们 他们 她们 它们 咱们 大家 自己 人家 这个 那个 哪个 这些 那些 这样 那样 这么 那么
    这里 那里 哪里 这儿 那儿 什么 怎么 怎么样 怎样 为什么 为何 如何 多少 几个 是否 是不是 有没有
    可以 可能 能够 应该 应当 需要 必须 不能 不会 不要 没有 没什么 不是 就是 还是 但是 可是 不过
    因为 所以 因此 如果 假如 要是 虽然 尽管 然后 然而 而且 并且 或者 以及 以及 同时 另外 此外
    已经 曾经 正在 一直 一下 一些 一个 一点 一起 一样 一般 一定 一次 一种 有点 有些 有的 所有
    非常 特别 比较 相当 十分 真的 其实 当然 确实 好像 似乎 大概 也许 或许 可能性
    现在 今天 明天 昨天 刚才 最近 之前 之后 以前 以后 时候 时间 那时 这时 当时 后来 目前
    觉得 认为 知道 看看 想想 告诉 一下子 东西 事情 问题 情况 方面 地方 方式 部分 内容
    你好 您好 谢谢 感谢 好的 好吧 嗯嗯 哈哈 哈哈哈 请问 麻烦 帮忙 帮我 帮助 请 能不能 可不可以
    关于 对于 上次 上回 那次 这次 本次 之前 记得 还记得 聊过 说过 讲过 提过 聊聊 聊天 对话 会话
    用户 助手 询问 讨论 提到 表示 介绍 分享 建议 提出 认为 希望 想要 打算 准备 计划 表达 说明
    进行 开始 继续 完成 得到 出现 发现 包括 通过 根据 使用 利用 作为 成为 没事 不错 怎么办 怎么做
    推荐 帮她 帮他 给出 给了 列了 到底 究竟 早上好 晚上好 下午好 早安 晚安 再见 拜拜
    早上 上午 中午 下午 晚上 今晚 每天 每周 每月 周末 周一 周二 周三 周四 周五 周六 周日 星期
    今年 明年 去年 本周 这周 上周 下周 这个月 上个月 下个月 这两天 前几天 过几天 一会儿 马上
    """.split()
)

STOP_EN = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further get got had hadn't has hasn't have
    haven't having he her here hers herself him himself his how i if in into is isn't it it's its
    itself just let's me more most mustn't my myself no nor not now of off on once only or other
    ought our ours ourselves out over own same shan't she should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they this those through to
    too under until up very was wasn't we were weren't what when where which while who whom why
    will with won't would wouldn't you your yours yourself yourselves
    s t d ll m re ve don isn aren wasn weren hasn haven hadn doesn didn won wouldn shan shouldn
    couldn mustn
    hi hello hey thanks thank please ok okay yes yeah sure well really maybe like just still even
    also much many lot lots thing things something anything stuff way ways one two etc via
    user users assistant asked ask asking discussed discuss discussing talked talk talking
    mentioned mention said say says wanted want wants suggested suggest suggests help helped
    helping remember recall last time session conversation chat today yesterday tomorrow again
    need needs needed think thought know make made use used using new good great
    write writes writing wrote written plan plans planned planning could would
    come comes came coming goes went going gone back take takes took taken give gives gave
    given keep keeps kept put find finds found seem seems look looks looked instead whether
    actually every another next first still already around without within
    """.split()
)

# One-character Chinese nouns that name a topic (狗, 车, 房 …): kept although single
# characters are otherwise dropped (most are particles, verbs or measure words).
KEEP_SINGLE_ZH = frozenset("狗猫车房书药钱茶酒鱼花琴球鞋猪马牛鸟病雪海山湖")
# jieba glues a pronoun to the next character (我要, 我试, 你说): such two-character pieces
# carry no topic.
_PRONOUNS = frozenset("我你您他她它咱")

# --- tokenisation -----------------------------------------------------------------------

# numeral + classifier (一只, 两个, 三次, 几套 ...) says nothing about a topic
_NUM_CLASSIFIER = re.compile(r"^[一二两三四五六七八九十几每半]+[个只次天件套本位种条张家周年月点些句遍趟]$")
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

_LOCK = threading.Lock()
_tokenizer: Any = None


def _jieba() -> Any:
    """The jieba tokenizer, loaded once (about half a second to a second the first time)."""
    global _tokenizer
    if _tokenizer is None:
        with _LOCK:
            if _tokenizer is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                tok = jieba.Tokenizer()
                tok.initialize()
                _tokenizer = tok
    return _tokenizer


def warm_up() -> None:
    """Load jieba's dictionary now (call at start, e.g. ``await asyncio.to_thread(warm_up)``)."""
    _jieba()


def is_warm() -> bool:
    return _tokenizer is not None


def prepare(text: str) -> str:
    return unicodedata.normalize("NFKC", text or "").casefold()


def words(text: str, *, search: bool = False) -> list[str]:
    """Content words in order of appearance (stop words, single characters, numbers dropped)."""
    text = prepare(text)
    if not text.strip():
        return []
    tok = _jieba()
    pieces = tok.lcut_for_search(text) if search else tok.lcut(text)
    out: list[str] = []
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        if CJK.search(piece):
            # jieba keeps CJK runs apart from Latin ones; drop any stray punctuation.
            word = "".join(ch for ch in piece if CJK.match(ch))
            if len(word) == 1 and word in KEEP_SINGLE_ZH:
                out.append(word)
                continue
            if search and len(word) >= 2:
                # 小狗 / 狗叫 also yield 狗, so a word glued to a topic noun still meets it
                out.extend(ch for ch in word if ch in KEEP_SINGLE_ZH)
            if (len(word) >= 2 and word not in STOP_ZH and not _NUM_CLASSIFIER.match(word)
                  and not (len(word) == 2 and word[0] in _PRONOUNS)):
                out.append(word)
            continue
        for word in _LATIN_WORD.findall(piece):
            word = word.split("'")[0] if word.endswith(("'s", "'t", "'re", "'ve", "'ll", "'d", "'m")) else word
            if len(word) < 2 or word.isdigit() or word in STOP_EN:
                continue
            out.append(word)
    return out


def stem(word: str) -> str:
    """A light English suffix stripper, the same on both sides of a search.

    Not a real stemmer: it only needs to send inflections of one word to one form
    (price/prices/pricing → pric, deploy/deployed/deploying → deploy).
    """
    if not word.isascii() or len(word) <= 3 or not word.isalpha():
        return word
    for suffix, minlen in (("ies", 5), ("ing", 6), ("ed", 6), ("es", 5), ("s", 4)):
        if word.endswith(suffix) and len(word) >= minlen:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                break
            if suffix == "es" and not word.endswith(("ches", "shes", "xes", "sses", "zes")):
                continue
            word = word[: len(word) - len(suffix)] + ("y" if suffix == "ies" else "")
            break
    if len(word) > 4 and word.endswith("e"):
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]      # planned → plann → plan, running → runn → run
    return word


def search_terms(text: str) -> list[str]:
    """Distinct search terms of ``text`` (jieba search mode, stemmed English), in order."""
    seen: dict[str, None] = {}
    for w in words(text, search=True):
        seen.setdefault(stem(w), None)
    return list(seen)


def index_terms(text: str) -> list[str]:
    """The words indexed for ``text`` with their repeats (term frequency is kept for BM25)."""
    return [stem(w) for w in words(text, search=True)]


def is_common_zh(word: str) -> bool:
    """A Chinese word among the ~150 commonest of the language (公司, 工作, 时间 …): jieba's
    dictionary count at least ``COMMON_ZH_COUNT``."""
    return bool(CJK.search(word)) and (_jieba().FREQ.get(word) or 0) >= COMMON_ZH_COUNT
