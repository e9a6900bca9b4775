"""Semantic recall end to end (issue 31): signed webhook events, the fake model, and the real
``openai`` client embedding through the fake embeddings server (ETHAN_EMBEDDING_MODEL on a
config.yaml-style provider). A paraphrased question reaches the session's line in the model's
request; after ``/forget`` that line reaches it from no layer — vectors included."""

from __future__ import annotations

import json

import pytest

from bot.infra.config.sections import ProviderConfig
from memory.scope import Scope
from tests.fakes.fake_anthropic import Text, default_responder, is_chat
from tests.fakes.fake_embeddings import FakeEmbeddings
from tests.harness import Harness

pytestmark = [pytest.mark.usefixtures("model_provider"), pytest.mark.app_backends]

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
CONCEPTS = {"relax": "calm", "unwind": "calm", "pottery": "calm", "放": "calm", "松": "calm"}
SESSIONS = [
    ["I have been so stressed at work lately", "Last month I started pottery classes on Thursdays",
     "The studio is near the river"],
    ["We are planning the garden this spring", "Tomatoes and basil on the balcony"],
    ["Thinking about a trip to Lisbon in May", "Flights are expensive this year"],
]
SUMMARIES = {"pottery": "Stress at work; a new weekly class.", "garden": "Planning the spring garden.",
             "Lisbon": "A trip to Lisbon in May."}


async def _say(h, text, **who):
    n = len(h.lark.messages()) + 1
    await h.send_text(text, **who)
    await h.replies(n)
    await h.idle()


def _summary(req) -> dict:
    said = json.dumps(getattr(req, "json", req), ensure_ascii=False)
    return {"summary": next((v for k, v in SUMMARIES.items() if k in said), "Small talk.")}


async def test_a_paraphrase_reaches_the_model_and_forget_takes_it_from_every_layer_with_vectors(
        tmp_path, monkeypatch):
    monkeypatch.setenv("EMBED_TEST_KEY", "test-embed-key")
    with FakeEmbeddings(concepts=CONCEPTS) as emb:
        provider = ProviderConfig(kind="openai", base_url=emb.openai_base_url, api_key_env="EMBED_TEST_KEY")
        async with Harness(tmp_path, providers={"emb": provider}, ethan_embedding_model="emb:fake-embed") as h:
            h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
            h.model.on_tool("write_summary", _summary, keys={"summary"})
            for lines in SESSIONS:
                for line in lines:
                    await _say(h, line, **ALICE)
                await _say(h, "/new", **ALICE)
            assert await h.app.indexer.wait_idle(timeout=20)
            assert any("pottery" in t for t in emb.inputs())         # the lines were embedded
            # the question shares no word with the line: only the vectors find it
            await _say(h, "What do I do to unwind?", **ALICE)
            body = json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)
            assert "<related_episodes>" in body and "pottery classes" in body
            fact = await h.app.memory.facts.add(Scope("ou_alice", "oc_p2p_alice", "p2p"),
                                                "User started pottery classes on Thursdays", "knowledge",
                                                source="agent_proactive")
            await _say(h, "/new", **ALICE)
            await _say(h, f"/forget {fact.fact.id}", **ALICE)
            emb.requests.clear()
            assert await h.app.indexer.wait_idle(timeout=20)
            assert emb.requests and not any("pottery" in t for t in emb.inputs())   # re-embedded without it
            await _say(h, "What do I do to unwind?", **ALICE)
            body = json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)
            assert "pottery" not in body                               # no layer carries it, vectors included
