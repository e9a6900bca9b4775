"""Generated multi-session conversations with labelled evidence sessions (issue 19).

Each user has several sessions; each session is one topic from ``TOPICS`` (Chinese or
English) with its slots filled from varied values (names, places, numbers, things), a few
turns of the user talking about it, and one *detail* said in the middle of the session.
Questions ask about that detail or the topic later, as a user would ("我女儿比赛在哪个城
市来着？", "Which gym did I sign up at?") — mostly without a cue word and short — and are
labelled with the session that holds the evidence. ``unrelated`` messages are about things
the user never talked about (general questions, and other topics' questions this user never
had), and must get no episode.

``corpus(seed, users, sessions_per_user)`` is deterministic for a seed. The quick labelled
set in the suite is ``corpus(seed=19, users=4, sessions_per_user=8)``; the bench generates
larger ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Each topic: lang, opener lines, the detail line, filler lines, question forms.
# Slots: {a} {b} {n} filled per session from the topic's own value lists.
TOPICS: list[dict] = [
    dict(key="piano", lang="zh",
         a=["小雨", "朵朵", "乐乐", "悠悠", "甜甜"], b=["苏州", "南京", "成都", "厦门", "青岛"], n=["三", "五", "七"],
         lines=["我女儿{a}最近在练钢琴，每天练一个小时。", "她老师说她的左手还不够稳。",
                "{a}下个月要去{b}参加少儿钢琴比赛，弹肖邦的夜曲。", "我有点担心她上台会紧张。",
                "她学琴已经{n}年了。", "你觉得比赛前一周应该怎么安排练习？"],
         questions=["{a}的钢琴比赛在哪个城市？", "我女儿比赛弹什么曲子来着", "钢琴比赛前怎么缓解紧张",
                    "{a}学琴几年了？"]),
    dict(key="move", lang="zh",
         a=["浦东", "徐汇", "静安", "闵行"], b=["两居室", "一室一厅", "三居室"], n=["六千", "八千五", "一万二"],
         lines=["我打算下个月搬家，现在住的地方离公司太远了。", "每天通勤要一个半小时。",
                "看中了{a}的一套{b}，月租{n}。", "房东要求押二付三。", "搬家公司报价还没定。",
                "你觉得合同里要注意哪些条款？"],
         questions=["我看中的房子月租多少？", "我要搬去{a}的什么户型", "租房合同要注意什么条款",
                    "押二付三是哪套房子的要求"]),
    dict(key="insomnia", lang="zh",
         a=["褪黑素", "酸枣仁", "白噪音"], b=["两点", "三点", "凌晨一点"], n=["两周", "一个月", "三周"],
         lines=["我最近失眠很严重，躺下好久都睡不着。", "经常到{b}还醒着。", "这种情况持续{n}了。",
                "朋友推荐我试试{a}，不知道有没有用。", "白天上班特别困，咖啡喝了三杯。", "晚上玩手机会不会影响睡眠？"],
         questions=["朋友推荐我试的助眠方法是什么？", "失眠的问题怎么办", "我失眠持续多久了",
                    "我一般几点还睡不着"]),
    dict(key="car", lang="zh",
         a=["比亚迪海豹", "特斯拉Model3", "小鹏P7", "蔚来ET5"], b=["二十五万", "三十万", "二十万"], n=["两次", "三次"],
         lines=["我在考虑买一辆电动车。", "主要是上下班开，偶尔跑长途。", "预算大概{b}左右。",
                "试驾了{n}，最喜欢{a}。", "担心冬天续航打折。", "家里小区能装充电桩吗？"],
         questions=["我最喜欢试驾的哪款车？", "买电动车预算多少来着", "冬天电动车续航怎么样",
                    "小区装充电桩要什么手续"]),
    dict(key="thesis", lang="zh",
         a=["图神经网络", "联邦学习", "对比学习"], b=["王教授", "李老师", "陈教授"], n=["四月", "五月", "六月"],
         lines=["我的毕业论文开题了。", "题目是关于{a}在推荐系统里的应用。", "导师是{b}，要求挺严格的。",
                "实验数据集还没选好。", "{n}要交初稿。", "你能帮我看看相关工作怎么组织吗？"],
         questions=["我的论文题目是什么方向？", "论文初稿什么时候交", "我导师是谁",
                    "推荐系统的论文数据集选哪个好"]),
    dict(key="dog", lang="zh",
         a=["豆豆", "旺财", "可乐", "团子"], b=["柯基", "金毛", "柴犬", "泰迪"], n=["三个月", "半岁", "两岁"],
         lines=["我家新养了一只狗。", "是一只{b}，叫{a}。", "{a}现在{n}大。", "它总是半夜叫。",
                "疫苗还差最后一针。", "狗粮应该怎么选？"],
         questions=["我家狗叫什么名字？", "{a}是什么品种", "狗半夜叫怎么办", "小狗疫苗要打几针"]),
    dict(key="interview", lang="zh",
         a=["字节跳动", "阿里巴巴", "美团", "腾讯"], b=["二面", "三面", "终面"], n=["周三", "周五", "下周一"],
         lines=["我在准备跳槽面试。", "投了{a}的后端岗位。", "已经过了一面，{n}是{b}。",
                "面试官喜欢问系统设计。", "我对分布式锁不太熟。", "你能出几道题让我练练吗？"],
         questions=["我投的是哪家公司？", "下一轮面试是什么时候", "分布式锁面试怎么答",
                    "{a}的面试准备得怎么样了"]),
    dict(key="trip_zh", lang="zh",
         a=["云南", "新疆", "西藏", "海南"], b=["父母", "老婆", "孩子"], n=["五天", "一周", "十天"],
         lines=["国庆想带{b}出去玩。", "目的地定了{a}。", "一共玩{n}。", "担心{b}身体吃不消。",
                "机票已经订好了。", "当地有什么必吃的？"],
         questions=["国庆去哪里玩来着？", "我国庆带谁出去", "{a}有什么好吃的", "这次旅行玩几天"]),
    dict(key="gym", lang="en",
         a=["Crossfit Downtown", "Iron Temple", "PureGym Camden", "Anytime Fitness"], b=["Marco", "Priya", "Jake"],
         n=["three", "four", "five"],
         lines=["I finally signed up for a gym membership.", "It's {a}, ten minutes from my flat.",
                "My trainer is called {b}.", "We agreed on {n} sessions a week.", "My knees hurt after squats though.",
                "What should I eat after a workout?"],
         questions=["Which gym did I sign up at?", "What's my trainer's name?", "how many sessions a week did we agree",
                    "my knees hurt after squats, what should I do"]),
    dict(key="wedding", lang="en",
         a=["Lisbon", "Lake Como", "Santorini", "Edinburgh"], b=["Sophie", "Hannah", "Clara"], n=["120", "80", "150"],
         lines=["My sister {b} is getting married next summer.", "I'm the maid of honour.",
                "The wedding will be in {a}.", "They expect about {n} guests.", "I have to give a speech and I'm terrified.",
                "Can you help me structure a toast?"],
         questions=["Where is my sister's wedding?", "how many guests at the wedding", "help with the maid of honour speech",
                    "What's my sister's name?"]),
    dict(key="laptop", lang="en",
         a=["ThinkPad X1 Carbon", "MacBook Air", "Dell XPS 13", "Framework 13"], b=["1500", "1200", "2000"],
         n=["16", "32"],
         lines=["My old laptop died last week.", "I need something light for travel.",
                "I'm leaning towards the {a}.", "Budget is around {b} dollars.", "I want at least {n} GB of RAM.",
                "Is the battery life good enough for long flights?"],
         questions=["Which laptop was I leaning towards?", "what was my laptop budget", "how much RAM did I want",
                    "laptop battery life on long flights"]),
    dict(key="garden", lang="en",
         a=["tomatoes", "basil", "chillies", "strawberries"], b=["balcony", "backyard", "allotment"], n=["aphids", "slugs", "mildew"],
         lines=["I started a small vegetable garden this spring.", "It's on my {b}.", "I'm mostly growing {a}.",
                "But the leaves are covered in {n}.", "I water them every morning.", "Should I use organic pesticide?"],
         questions=["What am I growing in my garden?", "how do I get rid of {n}", "where is my vegetable garden",
                    "organic pesticide for my plants"]),
    dict(key="promotion", lang="en",
         a=["senior engineer", "staff engineer", "team lead"], b=["Karen", "David", "Mei"], n=["March", "June", "September"],
         lines=["I'm up for promotion this cycle.", "The role is {a}.", "My manager {b} is supportive.",
                "The committee meets in {n}.", "I need to write a promotion packet.", "What should the packet highlight?"],
         questions=["When does the promotion committee meet?", "what role am I up for", "who is my manager",
                    "how to write a promotion packet"]),
    dict(key="marathon", lang="en",
         a=["Berlin", "Chicago", "Boston", "Tokyo"], b=["3:45", "4:00", "3:30"], n=["shin splints", "a sore hip", "blisters"],
         lines=["I'm training for the {a} marathon.", "My goal time is {b}.", "I run five days a week.",
                "Lately I've had {n}.", "My long runs are up to 28 km.", "How should I taper before race day?"],
         questions=["Which marathon am I training for?", "what's my marathon goal time", "how to taper before the race",
                    "I have {n} from running"]),
    dict(key="visa", lang="en",
         a=["Canada", "Germany", "Australia", "Japan"], b=["work permit", "student visa", "skilled migrant visa"],
         n=["six weeks", "three months", "two months"],
         lines=["I'm applying for a {b}.", "The destination is {a}.", "Processing takes about {n}.",
                "I still need a police certificate.", "My employer is sponsoring me.", "What documents are usually missing?"],
         questions=["Which country is my visa for?", "how long does the visa processing take", "what kind of visa am I applying for",
                    "do I need a police certificate"]),
    dict(key="band", lang="en",
         a=["bass", "drums", "keyboard"], b=["The Night Owls", "Static Bloom", "Paper Tigers"], n=["Friday", "Saturday"],
         lines=["I joined a band with some coworkers.", "We're called {b}.", "I play {a}.",
                "Our first gig is this {n} at a local pub.", "We only know eight songs so far.", "How do we handle stage fright?"],
         questions=["What's my band called?", "what instrument do I play", "when is our first gig",
                    "stage fright before a gig"]),
]

# Small talk mixed into every session, so sessions are long and the detail sits in the middle
# (where an extractive summary of a long session no longer reaches).
FILLER = {
    "zh": ["今天又加班到很晚。", "中午吃了一碗牛肉面。", "外面下雨了，有点冷。", "刚开完一个很长的会。",
           "周末想好好休息一下。", "最近工作挺忙的。", "早上地铁特别挤。", "同事请我喝了奶茶。",
           "晚上想看个电影放松一下。", "手机快没电了。", "这周过得好快。", "刚刚去楼下买了咖啡。"],
    "en": ["Work was busy again today.", "I had noodles for lunch.", "It's raining and a bit cold here.",
           "Just got out of a long meeting.", "I want to rest this weekend.", "The train was packed this morning.",
           "A coworker bought me coffee.", "Maybe I'll watch a movie tonight.", "My phone is almost out of battery.",
           "This week went by so fast.", "I just grabbed a coffee downstairs.", "Long day, honestly."],
}
FILLER_LINES = 8

UNRELATED_ZH = [
    "帮我写一首关于秋天的诗", "一公斤等于多少磅", "Python 里怎么反转列表", "给我讲个笑话",
    "北京到上海的高铁要多久", "怎么做红烧肉", "光合作用是什么原理", "推荐几部科幻电影",
    "牛顿第二定律是什么", "帮我把这句话翻译成英文：今天很开心", "怎么煮溏心蛋", "世界上最高的山是哪座",
    "地球到月球有多远", "怎么给电脑清灰"  # (not 手机: the small talk has 手机快没电了), "番茄炒蛋先放什么", "量子计算机是什么",
]
UNRELATED_EN = [
    "Write me a haiku about the sea", "How many ounces are in a pound?", "What's the capital of Australia?",
    "Explain how vaccines work", "Tell me a joke about penguins", "How do I reverse a string in JavaScript?",
    "What's the difference between weather and climate?", "Recommend a good sci-fi novel",
    "How do I make pancakes?", "Why is the sky blue?", "What is a black hole?", "How do I unclog a sink?",
    "Convert 30 Celsius to Fahrenheit", "Who painted the Mona Lisa?", "How does compound interest work?",
    "What's a good name for a goldfish?",
]


@dataclass
class Session:
    label: str
    user: str
    lang: str
    lines: list[str]
    topic: str


@dataclass
class Corpus:
    sessions: list[Session] = field(default_factory=list)
    # (user, question, label of the evidence session)
    questions: list[tuple[str, str, str]] = field(default_factory=list)
    # (user, message) about nothing the user talked about
    unrelated: list[tuple[str, str]] = field(default_factory=list)
    # issue 31: (user, question, label, evidence line) — the question shares no content word
    # with the evidence line (needs semantic recall)
    paraphrased: list[tuple[str, str, str, str]] = field(default_factory=list)
    # issue 31: (user, question, (label, label), (question, question)) — two questions of two
    # sessions asked in one message; both sessions' evidence must arrive
    two_hop: list[tuple[str, str, tuple[str, str], tuple[str, str]]] = field(default_factory=list)


# issue 31: questions that share no content word with the evidence line (topic line index)
PARAPHRASES: dict[str, tuple[str, int]] = {
    "piano": ("孩子演出要去哪座城市？", 2),
    "dog": ("我家宠物是什么品种？", 1),
    "thesis": ("谁在指导我的毕业研究？", 2),
    "insomnia": ("有人建议我用什么帮助入眠？", 3),
    "gym": ("Who coaches me at the fitness club?", 2),
    "laptop": ("How much am I willing to spend on a new computer?", 3),
    "marathon": ("What finish am I aiming for in the race?", 1),
    "band": ("Which instrument is mine in the group?", 2),
}


def corpus(seed: int = 19, users: int = 4, sessions_per_user: int = 8) -> Corpus:
    rnd = random.Random(seed)
    out = Corpus()
    for u in range(users):
        user = f"ou_gen{u}"
        topics = rnd.sample(TOPICS, min(sessions_per_user, len(TOPICS)))
        used = {t["key"] for t in topics}
        for i, t in enumerate(topics):
            slots = {k: rnd.choice(t[k]) for k in ("a", "b", "n")}
            label = f"{user}:{i}"
            lines = [line.format(**slots) for line in t["lines"]]
            for filler in rnd.sample(FILLER[t["lang"]], FILLER_LINES):
                lines.insert(rnd.randint(2, len(lines)), filler)
            out.sessions.append(Session(label, user, t["lang"], lines, t["key"]))
            for q in t["questions"]:
                out.questions.append((user, q.format(**slots), label))
            if t["key"] in PARAPHRASES:
                pq, idx = PARAPHRASES[t["key"]]
                out.paraphrased.append((user, pq, label, t["lines"][idx].format(**slots)))
        mine = [(q, label) for qu, q, label in out.questions if qu == user]
        firsts = [next(q for q, lab in mine if lab == f"{user}:{i}") for i in range(len(topics))]
        for i in range(0, len(topics) - 1, 2):      # sessions i and i+1, one question each
            q1, q2 = firsts[i], firsts[i + 1]
            joined = f"{q1.rstrip('？?')}？另外，{q2}" if topics[i]["lang"] == "zh" else f"{q1} Also, {q2}"
            out.two_hop.append((user, joined, (f"{user}:{i}", f"{user}:{i + 1}"), (q1, q2)))
        others = [t for t in TOPICS if t["key"] not in used]
        for t in rnd.sample(others, min(3, len(others))):
            slots = {k: rnd.choice(t[k]) for k in ("a", "b", "n")}
            out.unrelated.append((user, rnd.choice(t["questions"]).format(**slots)))
        for m in rnd.sample(UNRELATED_ZH, 4) + rnd.sample(UNRELATED_EN, 4):
            out.unrelated.append((user, m))
    return out


def evidence_words(session: Session, question: str) -> set[str]:
    """The words that answer ``question``: the session line sharing most words with it (the
    labelled evidence turn, filler excluded) minus the question's own words — e.g. the city in
    "{a}下个月要去{b}参加少儿钢琴比赛" for "{a}的钢琴比赛在哪个城市？". Empty when no line shares a word."""
    from memory.text.tokenizer import search_terms

    asked = set(search_terms(question))
    filler = set(FILLER[session.lang])
    best: tuple[int, set[str]] = (0, set())
    for line in session.lines:
        if line in filler:
            continue
        terms = set(search_terms(line))
        shared = len(terms & asked)
        if shared > best[0]:
            best = (shared, terms)
    answer = best[1] - asked
    return answer or best[1]


def topic_summary(session: Session) -> str:
    """What a summary of the session keeps at the least: its first two lines (its topic).
    The details said later are in the turns only — the case the turn index is for."""
    return " ".join(session.lines[:2])


async def load(store, c: Corpus, *, with_turns: bool = True, t0: float = 1_760_000_000.0) -> dict[int, str]:
    """Write every session's episode (p2p, one chat per user); returns {episode id: label}."""
    label_of: dict[int, str] = {}
    for i, s in enumerate(c.sessions):
        ts = t0 + i * 86400
        ep = await store.write(
            session_id=s.label, user_id=s.user, chat_id=f"oc_{s.user}", chat_type="p2p",
            summary=topic_summary(s), turn_count=len(s.lines), model="test",
            turns=s.lines if with_turns else None, timestamp=ts, started_at=ts - 600, ended_at=ts)
        label_of[ep.id] = s.label
    return label_of


async def retrieval(store, c: Corpus, label_of: dict[int, str], method: str, k: int = 3) -> tuple[float, list]:
    """recall@k of the evidence session over the questions; and the misses."""
    hit, misses = 0, []
    for user, q, label in c.questions:
        found = [label_of[e.id] for e in await store.search(user, q, limit=k, method=method)]
        if label in found:
            hit += 1
        else:
            misses.append((q, label, found))
    return hit / max(1, len(c.questions)), misses


async def gate(store, c: Corpus, label_of: dict[int, str]) -> dict:
    """Recall (the injection gate) over related questions and unrelated messages."""
    from memory.scope import Scope

    related_hit = related_any = 0
    injected_wrong = 0
    misses = []
    for user, q, label in c.questions:
        got = [label_of[e.id] for e in await store.recall(Scope(user, f"oc_{user}", "p2p"), q)]
        related_any += bool(got)
        related_hit += label in got
        injected_wrong += sum(1 for g in got if g != label)
        if label not in got:
            misses.append((q, label, got))
    unrelated_any = 0
    false = []
    for user, m in c.unrelated:
        got = [label_of[e.id] for e in await store.recall(Scope(user, f"oc_{user}", "p2p"), m)]
        if got:
            unrelated_any += 1
            false.append((m, got))
    injections = related_any and sum(1 for _ in c.questions)
    return {
        "recall": related_hit / max(1, len(c.questions)),
        "unrelated_share": unrelated_any / max(1, len(c.unrelated)),
        "wrong_alongside": injected_wrong,
        "misses": misses, "false": false, "injections": injections,
    }
