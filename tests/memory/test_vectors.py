"""Episode vectors and semantic recall (issue 31), on both backends, at the wire: the real
``openai`` client (bot/llm/embeddings.py) against the fake embeddings server.

The fake's vectors put chosen words on one concept (tests/fakes/fake_embeddings.py), so a
question that shares no word with what was said can still be its neighbour — as with a real
model — and each property below can be broken and seen failing (docs/reliability.md).
"""

from __future__ import annotations

import logging

import pytest

from bot.llm.embeddings import OpenAIEmbedder
from bot.llm.openai_model import make_client
from memory.episodes import vectors
from memory.episodes.store import EpisodeStore
from memory.governance.erase import erase_user
from memory.governance.forget import forget_fact
from memory.facts.store import FactStore
from memory.scope import Scope
from memory.episodes.vectors import EmbeddingIndexer
from tests.fakes.fake_embeddings import FakeEmbeddings

ALICE = Scope("ou_alice", "oc_alice", "p2p")
# "relax" and "pottery" mean the same to the fake model; so do 放松 and 陶艺's characters
CONCEPTS = {"relax": "calm", "unwind": "calm", "pottery": "calm", "ceramics": "calm",
            "放": "calm", "松": "calm", "陶": "calm", "艺": "calm"}

POTTERY = ["I have been so stressed at work lately.", "My manager keeps moving deadlines.",
           "Last month I started pottery classes on Thursdays.", "The studio is near the river.",
           "Anyway, the project review is on Friday."]
GARDEN = ["We are planning the garden this spring.", "Tomatoes and basil on the balcony.",
          "The soil needs more compost."]
TRAVEL = ["Thinking about a trip to Lisbon in May.", "Flights are expensive this year.",
          "Maybe the train through Spain instead."]


_clients: list[OpenAIEmbedder] = []


@pytest.fixture
async def fake():
    with FakeEmbeddings(concepts=CONCEPTS) as f:
        yield f
        while _clients:
            await _clients.pop().aclose()


def embedder(fake: FakeEmbeddings, model: str = "fake-embed") -> OpenAIEmbedder:
    client = make_client(api_key=fake.api_key or "", base_url=fake.openai_base_url, stall_timeout=5.0)
    _clients.append(OpenAIEmbedder(client, model, name=f"emb:{model}"))
    return _clients[-1]


async def _write(store: EpisodeStore, sid: str, lines: list[str], ts: float, user: str = "ou_alice") -> int:
    ep = await store.write(session_id=sid, user_id=user, chat_id="oc_alice" if user == "ou_alice" else "oc_bob",
                           chat_type="p2p", summary=" ".join(lines[:2]), turn_count=len(lines), model="test",
                           turns=lines, timestamp=ts, started_at=ts - 60, ended_at=ts)
    return ep.id


async def _sessions(store: EpisodeStore) -> dict[str, int]:
    return {"pottery": await _write(store, "s1", POTTERY, 1_760_000_000.0),
            "garden": await _write(store, "s2", GARDEN, 1_760_100_000.0),
            "travel": await _write(store, "s3", TRAVEL, 1_760_200_000.0)}


async def _index(db, emb) -> EmbeddingIndexer:
    idx = EmbeddingIndexer(db, emb)
    while await idx.run_once():
        pass
    return idx


async def test_a_paraphrased_question_recalls_its_session_with_the_line_that_answers(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    ids = await _sessions(store)
    # without vectors: the words share nothing, BM25 finds nothing
    assert await EpisodeStore(db).recall(ALICE, "What do I do to unwind?") == []
    idx = await _index(db, emb)
    assert idx.embedded == 3
    assert await vectors.count(db, emb.model) == 3 + len(POTTERY) + len(GARDEN) + len(TRAVEL)
    got = await store.recall(ALICE, "What do I do to unwind?")
    assert [e.id for e in got] == [ids["pottery"]]
    assert any("pottery classes" in line for line in got[0].evidence)    # the line, not just the heading
    # the words still decide where they match: the garden question gets the garden session
    assert [e.id for e in await store.recall(ALICE, "What did I plan for the garden, tomatoes?")] == [ids["garden"]]


async def test_vectors_are_read_for_the_owner_only(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    await _sessions(store)
    await _index(db, emb)
    bob = Scope("ou_bob", "oc_bob", "p2p")
    await _write(store, "b1", ["Bob talks about his car.", "The brakes squeak."], 1_760_300_000.0, user="ou_bob")
    await _write(store, "b2", ["Bob's kitchen needs new tiles.", "Grey or white tiles."], 1_760_400_000.0, user="ou_bob")
    await _write(store, "b3", ["Bob's sister visits in June.", "She likes jazz."], 1_760_500_000.0, user="ou_bob")
    await _index(db, emb)
    assert await store.recall(bob, "What do I do to unwind?") == []      # Alice's pottery is not Bob's


async def test_a_changed_episode_loses_its_vectors_and_is_embedded_again(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    ids = await _sessions(store)
    await _index(db, emb)
    fact = await FactStore(db).add(ALICE, "User started pottery classes on Thursdays", "knowledge",
                                    source="agent_proactive")
    await forget_fact(db, "ou_alice", fact.fact.id)
    # the trigger dropped the changed episode's vectors in forget's own transaction
    rows = await db.fetchall("SELECT DISTINCT episode_id FROM episode_vectors")
    assert ids["pottery"] not in {r["episode_id"] for r in rows}
    assert await store.recall(ALICE, "What do I do to unwind?") == []
    fake.requests.clear()
    await _index(db, emb)
    assert not any("pottery" in t for t in fake.inputs())               # re-embedded without the line
    got = await store.recall(ALICE, "What do I do to unwind?")
    assert not any("pottery" in line for e in got for line in [e.summary, *e.evidence])


async def test_erase_removes_every_vector_of_the_user(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    await _sessions(store)
    await _index(db, emb)
    assert await vectors.count(db) > 0
    await erase_user(db, "ou_alice")
    assert await vectors.count(db) == 0


async def test_a_model_change_re_embeds_in_the_background(db, fake):
    old = embedder(fake, "fake-embed")
    await _sessions(EpisodeStore(db, embedder=old))
    await _index(db, old)
    new = embedder(fake, "fake-embed-2")
    n = await vectors.count(db, old.model)
    await _index(db, new)
    assert await vectors.count(db, new.model) == n and await vectors.count(db, old.model) == 0
    got = await EpisodeStore(db, embedder=new).recall(ALICE, "What do I do to unwind?")
    assert len(got) == 1


async def test_endpoint_down_recall_falls_back_to_bm25_with_one_log_line(db, fake, caplog):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    ids = await _sessions(store)
    await _index(db, emb)
    fake.down = True
    fake.requests.clear()
    caplog.set_level(logging.INFO, logger="memory.episodes.semantic")
    got = await store.recall(ALICE, "What did I plan for the garden, tomatoes?")
    assert [e.id for e in got] == [ids["garden"]]                        # BM25 answered
    got = await store.recall(ALICE, "Which trip to Lisbon?")
    assert [e.id for e in got] == [ids["travel"]]
    lines = [r.getMessage() for r in caplog.records if "recall.embedding" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("recall.embedding_unavailable")
    assert len(fake.requests) == 1        # the endpoint is left alone for a while, not asked per message


async def test_a_stalled_endpoint_costs_recall_at_most_the_query_timeout(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb, query_timeout=0.2)
    ids = await _sessions(store)
    await _index(db, emb)
    fake.delay = 3.0
    got = await store.recall(ALICE, "What did I plan for the garden, tomatoes?")
    assert [e.id for e in got] == [ids["garden"]]


async def test_the_indexer_task_embeds_what_is_written_and_survives_an_outage(db, fake):
    emb = embedder(fake)
    store = EpisodeStore(db, embedder=emb)
    idx = EmbeddingIndexer(db, emb, poll_s=0.05)
    store.on_written = idx.nudge
    fake.down = True
    idx.start()
    try:
        await _sessions(store)
        assert not await idx.wait_idle(timeout=0.5)     # failing: nothing embedded, it keeps trying
        fake.down = False
        assert await idx.wait_idle(timeout=10)
        assert idx.embedded == 3
    finally:
        await idx.stop()


async def test_db_copy_carries_the_vectors_to_postgresql_and_they_answer_there(tmp_path, fake, pg_cluster):
    from memory.governance.copy import copy_database
    from storage import database

    emb = embedder(fake)
    src = await database(tmp_path / "src.db").open()
    dst = await database(pg_cluster.new_database()).open()
    try:
        ids = await _sessions(EpisodeStore(src, embedder=emb))
        await _index(src, emb)
        result = await copy_database(src, dst)
        assert result.counts["episode_vectors"] == await vectors.count(src) > 0
        got = await EpisodeStore(dst, embedder=emb).recall(ALICE, "What do I do to unwind?")
        assert [e.id for e in got] == [ids["pottery"]]
        idx = await _index(dst, emb)
        assert idx.embedded == 0                 # nothing to embed again after the copy
    finally:
        await src.close()
        await dst.close()


def test_the_embedding_setting_is_checked_at_start(tmp_path):
    from bot.infra.config import ConfigError, load_settings

    base = dict(_env_file=None, ethan_home=tmp_path)
    with pytest.raises(ConfigError, match="Anthropic API, which has no embeddings"):
        load_settings(**base, anthropic_api_key="k", ethan_embedding_model="anthropic:claude-sonnet-4-6")
    s = load_settings(**base, anthropic_api_key="k", ethan_embedding_model="text-embedding-3-small")
    assert s.embedding_ref() == ("openai", "text-embedding-3-small")    # a bare name: openai's
    s = load_settings(**base, openai_base_url="http://127.0.0.1:11434/v1", ethan_embedding_model="bge-m3")
    assert s.embedding_ref() == ("openai", "bge-m3")
    assert load_settings(**base, ethan_embedding_model="local").embedding_ref()[0] == "local"
    assert load_settings(**base).embedding_ref() is None


async def test_without_numpy_the_vectors_rank_the_same(db, fake, monkeypatch):
    # a remote embedding model needs no numpy: the SQL-function path must give the same ranking
    from memory.episodes.record import _where

    emb = embedder(fake)
    await _sessions(EpisodeStore(db, embedder=emb))
    await _index(db, emb)
    where, params = _where("ou_alice", ALICE, None)
    [q] = await emb.embed(["What do I do to unwind?"], query=True)
    with_numpy = await db.read(vectors.nearest, where, params, emb.model, q, 50)
    monkeypatch.setitem(__import__("sys").modules, "numpy", None)      # import numpy now fails
    without = await db.read(vectors.nearest, where, params, emb.model, q, 50)
    assert [(e, s) for e, s, _ in without] == [(e, s) for e, s, _ in with_numpy]
    assert all(abs(a[2] - b[2]) < 1e-5 for a, b in zip(without, with_numpy))
