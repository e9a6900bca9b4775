"""Episodes index what was said (issue 19): turns beside the summary, the recall gate on
the index's evidence, dates, deletion of a session's episode."""

from __future__ import annotations

import pytest

from memory.episodes.search import DEFAULT_METHOD
from memory.episodes.store import EpisodeStore
from memory.scope import Scope
from tests.memory import recall_corpus as R

# Measured on corpus(seed=19, users=4, sessions_per_user=8) — 32 sessions, 128 questions,
# 44 unrelated messages: rrf r@3 0.961 (summaries only 0.594); gate recall 0.922, 0 unrelated.
# On the larger generated set (seed=7, 12 users x 12 sessions: 576 questions, 132 unrelated)
# the gate recalls 0.934 and gives no unrelated message an episode (bench/bench_recall.py).
RRF_RECALL3_FLOOR = 0.90
GATE_RECALL_FLOOR = 0.85
UNRELATED_CEILING = 0.0       # issue 19's target: 0 unrelated episodes injected


@pytest.fixture
def store(db):
    return EpisodeStore(db)


@pytest.fixture
async def generated(store):
    c = R.corpus(seed=19, users=4, sessions_per_user=8)
    return c, await R.load(store, c)


async def test_turns_are_searched_beside_the_summary(store, generated):
    c, label_of = generated
    rrf, misses = await R.retrieval(store, c, label_of, "rrf")
    summaries_only, _ = await R.retrieval(store, c, label_of, "bm25")
    assert DEFAULT_METHOD == "rrf"
    assert rrf >= RRF_RECALL3_FLOOR, misses[:10]
    assert rrf > summaries_only + 0.2      # the details are in the turns only


async def test_the_gate_recalls_the_evidence_session_and_nothing_for_unrelated(store, generated):
    c, label_of = generated
    g = await R.gate(store, c, label_of)
    assert g["recall"] >= GATE_RECALL_FLOOR, g["misses"][:10]
    assert g["unrelated_share"] <= UNRELATED_CEILING, g["false"]


async def test_on_the_larger_generated_set_no_unrelated_message_gets_an_episode(store):
    # Before the lone-word rule (recall._lone_word_decides) 3 of 132 got one here: 我投的是哪家
    # 公司？ twice (公司, said in passing in a session about moving) and "What's the capital of
    # Australia?" (the visa session) — each on one matched word that says nothing of the user.
    c = R.corpus(seed=7, users=12, sessions_per_user=12)
    g = await R.gate(store, c, await R.load(store, c))
    assert g["false"] == [] and g["unrelated_share"] == 0.0
    assert g["recall"] >= GATE_RECALL_FLOOR, g["misses"][:10]
    assert g["wrong_alongside"] <= len(c.questions) * 0.02


async def test_one_matched_word_decides_only_when_it_is_specific_and_about_the_user(store):
    for i, (summary, line) in enumerate((
            ("用户打算搬家，嫌通勤太远。", "现在住的地方离公司太远了，看中了徐汇的一套两居室"),
            ("The user applies for a work permit.", "The destination is Australia."),
            ("The user signed up for a gym.", "My trainer is called Marco."),
            ("用户在准备跳槽面试。", "已经过了一面，周三是二面"))):
        await store.write(session_id=f"s{i}", user_id="u", chat_type="p2p", summary=summary, turn_count=2,
                          turns=[summary, line])
    for n in range(4):
        await store.write(session_id=f"o{n}", user_id="u", chat_type="p2p", summary=f"用户聊了税务问题{n}。",
                          turn_count=2, turns=["报税", "个税"])
    p2p = Scope("u", "oc_u", "p2p")
    assert await store.recall(p2p, "我投的是哪家公司？") == []            # 公司: among the commonest words
    assert await store.recall(p2p, "What's the capital of Australia?") == []   # not about the user
    assert [e.session_id for e in await store.recall(p2p, "我要搬去徐汇的什么户型")] == ["s0"]
    assert [e.session_id for e in await store.recall(p2p, "What's my trainer's name?")] == ["s2"]
    assert [e.session_id for e in await store.recall(p2p, "下一轮面试是什么时候")] == ["s3"]   # 我 dropped
    # a "last time" cue says the message is about a past conversation
    assert [e.session_id for e in await store.recall(p2p, "上次聊到公司的事")] == ["s0"]


async def test_a_detail_said_mid_session_is_recalled_with_its_excerpt_and_date(store):
    lines = ["I'm training for a marathon.", "Long day, honestly."] + ["Work was busy again today."] * 10 + [
        "My physio said the pain is from tight calves, so I bought a foam roller from Decathlon."]
    ep = await store.write(session_id="s1", user_id="u", chat_type="p2p", summary="The user trains for a marathon.",
                           turn_count=len(lines), turns=lines, started_at=1_760_000_000, ended_at=1_760_003_600)
    for i in range(4):
        await store.write(session_id=f"o{i}", user_id="u", chat_type="p2p", summary=f"The user asked about topic {i} taxes.",
                          turn_count=2, turns=["taxes again", "more taxes"])
    got = await store.recall(Scope("u", "oc_u", "p2p"), "what did my physio say?")
    assert [e.id for e in got] == [ep.id]
    assert "foam roller" in got[0].excerpt
    assert got[0].date == "2025-10-09" and got[0].started_at == 1_760_000_000


async def test_a_bare_last_time_cue_recalls_the_newest_episodes(store):
    for i, topic in enumerate(["失眠", "搬家", "面试"]):
        await store.write(session_id=f"s{i}", user_id="u", chat_type="p2p", summary=f"用户聊了{topic}的事情。",
                          turn_count=2, timestamp=1_760_000_000 + i)
    got = await store.recall(Scope("u", "oc_u", "p2p"), "还记得我们之前聊过的内容吗")
    assert [e.session_id for e in got] == ["s2", "s1"]
    assert await store.recall(Scope("u", "oc_u", "p2p"), "今天天气怎么样") == []
    # a cue is not enough to see another chat's episodes
    assert await store.recall(Scope("u", "oc_g", "group"), "还记得我们之前聊过的内容吗") == []


async def test_deleting_a_session_deletes_its_episode_and_its_turns(store, db):
    await store.write(session_id="s1", user_id="u", chat_type="p2p", summary="用户聊了失眠。", turn_count=2,
                      turns=["我最近失眠", "试了褪黑素"])
    assert await store.delete_session("s1") == 1
    assert await store.search("u", "褪黑素") == []
    row = await db.fetchone("SELECT COUNT(*) AS n FROM episode_chunks")
    assert row["n"] == 0



async def test_recall_injects_the_matching_lines_with_neighbours_within_the_budget(store):
    # issue 31: the words that answer the question reach the model — the line that holds them,
    # with one neighbour either side, dated and with its speaker; not only the summary
    from memory.episodes.evidence import RECALL_BUDGET_TOKENS, episode_lines
    from memory.text.tokens import estimate_tokens

    filler = [f"Work was busy again today, meeting number {i}." for i in range(20)]
    lines = ["I'm planning a trip to Japan.", *filler[:9], "Before that I renewed my passport.",
             "I started pottery classes last month at a studio called Clay Corner.",
             "The teacher is a retired architect.", *filler[9:]]
    ep = await store.write(session_id="s1", user_id="u", chat_type="p2p", summary="The user plans a trip to Japan.",
                           turn_count=len(lines), turns=lines, started_at=1_760_000_000, ended_at=1_760_003_600)
    await store.write(session_id="s2", user_id="u", chat_type="p2p", summary="The user moved flats.",
                      turn_count=3, turns=["We moved to a new flat.", "The pottery studio is now closer.", "ok"])
    for i in range(4):
        await store.write(session_id=f"o{i}", user_id="u", chat_type="p2p", summary=f"Taxes, part {i}.",
                          turn_count=2, turns=["taxes again", "more taxes"])
    got = await store.recall(Scope("u", "oc_u", "p2p"), "Where do I take my pottery classes?")
    assert got and got[0].id == ep.id
    rendered = [line for e in got for line in episode_lines(e)]
    assert rendered[0] == "- [2025-10-09] The user plans a trip to Japan." + rendered[0][len(
        "- [2025-10-09] The user plans a trip to Japan."):]                        # the summary heads it
    assert got[0].evidence == ["Before that I renewed my passport.",
                               "I started pottery classes last month (2025-09) at a studio called Clay Corner.",
                               "The teacher is a retired architect."]          # the line and its neighbours
    assert "  [2025-10-09] user: I started pottery classes last month (2025-09) at a studio called Clay Corner." in rendered
    assert not any("meeting number" in line for line in rendered)             # not the rest of the session
    # several sessions when several match, no line twice, within the budget
    assert estimate_tokens("\n".join(rendered)) <= RECALL_BUDGET_TOKENS
    assert len(rendered) == len(set(rendered))
    tight = await store.recall(Scope("u", "oc_u", "p2p"), "Where do I take my pottery classes?", max_tokens=60)
    assert estimate_tokens("\n".join(line for e in tight for line in episode_lines(e))) <= 60
