"""The bundled local embedding model (ETHAN_EMBEDDING_MODEL=local, memory/episodes/embedding.py): it loads
from the installed package with no network, and puts a paraphrase — Chinese and English, no
word in common — nearer than an unrelated line."""

from __future__ import annotations

from memory.episodes.embedding import LOCAL_MODEL, LocalEmbedder


async def test_the_local_model_embeds_offline_and_finds_the_paraphrase(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    e = LocalEmbedder()
    assert e.model == LOCAL_MODEL
    [q_en, q_zh] = await e.embed(["What do I do to relax?", "我平时怎么放松？"], query=True)
    lines = await e.embed(["I started pottery classes last month, it calms me down.",
                           "The quarterly tax report is due on Friday.",
                           "上个月我开始学陶艺，做陶的时候很平静。",
                           "季度税务报表周五要交。"])
    assert len(q_en) == 384 and abs(sum(x * x for x in q_en) - 1.0) < 1e-3

    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))

    assert dot(q_en, lines[0]) > dot(q_en, lines[1])
    assert dot(q_zh, lines[2]) > dot(q_zh, lines[3])
    assert dot(q_en, lines[2]) > dot(q_en, lines[3])        # across the two languages too
