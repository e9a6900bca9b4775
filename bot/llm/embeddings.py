"""The embeddings port's network adapter (memory/episodes/embedding.py ``Embedder``): any
OpenAI-compatible ``/v1/embeddings`` — OpenAI, Qwen (DashScope), Doubao (Ark), GLM, Gemini's
OpenAI endpoint, Ollama, vLLM … — through the ``openai`` client and its aiohttp transport.

``ETHAN_EMBEDDING_MODEL`` picks it (docs/memory.md "Embeddings"):

* empty (default): no embeddings, recall is BM25 alone, exactly as before;
* ``local``: multilingual-e5-small in-process (``memory.episodes.embedding.LocalEmbedder``, the optional
  extra ``ethan[local-embeddings]``), offline;
* ``provider:model`` or ``model``: that provider's endpoint (its base URL and key, as for chat
  models: ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` or a config.yaml ``providers:`` entry of kind
  openai); a bare model name goes to the main provider when it speaks the OpenAI API, else to
  ``openai``.
"""

from __future__ import annotations

from typing import Any, Sequence

import openai

from bot.llm.openai_model import make_client
from memory.episodes.embedding import Embedder, EmbeddingError, LocalEmbedder, clip, normalise

REQUEST_TIMEOUT_S = 20.0        # one embedding call of the background indexer


class OpenAIEmbedder:
    """``Embedder`` over an OpenAI-compatible ``/v1/embeddings``."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, *, name: str | None = None) -> None:
        self.client = client
        self._model = model
        self.model = name or model        # the vectors' space, stored beside them

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        items = [clip(t) for t in texts]
        if not items:
            return []
        try:
            resp = await self.client.embeddings.create(model=self._model, input=items, encoding_format="float")
        except openai.OpenAIError as e:
            raise EmbeddingError(f"{type(e).__name__}: {str(e)[:200]}") from e
        data = sorted(resp.data or [], key=lambda d: d.index)
        if len(data) != len(items):
            raise EmbeddingError(f"{len(items)} texts gave {len(data)} embeddings")
        out = []
        for d in data:
            vec = d.embedding
            if not isinstance(vec, list) or not vec:
                raise EmbeddingError("an embedding that is not a list of numbers")
            out.append(normalise(vec))
        return out

    async def aclose(self) -> None:
        await self.client.close()


def build_embedder(settings: Any) -> Embedder | None:
    """The configured embedder (``Settings.embedding_ref``), or None (ETHAN_EMBEDDING_MODEL empty)."""
    ref = settings.embedding_ref()
    if ref is None:
        return None
    provider, model = ref
    if provider == "local":
        return LocalEmbedder()
    p = settings.provider_config(provider)
    client = make_client(api_key=p.api_key, base_url=p.base_url or None, stall_timeout=REQUEST_TIMEOUT_S)
    return OpenAIEmbedder(client, model, name=f"{provider}:{model}")
