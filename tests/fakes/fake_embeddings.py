"""A fake OpenAI-compatible embeddings server (``POST /v1/embeddings``), driven by the real
``openai`` SDK over loopback (bot/llm/embeddings.py ``OpenAIEmbedder``).

Answers as OpenAI's API does: ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage"}``, ``input`` a string or a list of strings; a wrong bearer key
is 401, ``down = True`` answers 503 (``server_error``) to every request, ``delay`` holds each
answer that long. Every request is recorded (``requests``: the JSON bodies).

The vectors are deterministic and carry meaning the tests choose: each word (Latin words
lower-cased, each CJK character) counts towards one of ``DIM`` axes by its hash, after
``concepts`` maps it to a concept — so ``FakeEmbeddings(concepts={"relax": "calm",
"pottery": "calm"})`` makes "what do I do to relax?" and "I started pottery classes" neighbours
although they share no word. Unit length, like most real models' output.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re

from aiohttp import web

from .fake_lark import ThreadedAiohttpServer

DIM = 64
_WORD = re.compile(r"[a-z0-9]+|[\u3400-\u9fff]")


def fake_vector(text: str, concepts: dict[str, str] | None = None, dim: int = DIM) -> list[float]:
    vec = [0.0] * dim
    for w in _WORD.findall((text or "").lower()):
        c = (concepts or {}).get(w, w)
        h = int.from_bytes(hashlib.sha256(c.encode()).digest()[:4], "big")
        vec[h % dim] += 1.0
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    if not any(vec):
        vec[0] = 1.0
    return [x / norm for x in vec]


class FakeEmbeddings(ThreadedAiohttpServer):
    def __init__(self, *, api_key: str | None = "test-embed-key", concepts: dict[str, str] | None = None,
                 dim: int = DIM) -> None:
        super().__init__()
        self.api_key = api_key
        self.concepts = dict(concepts or {})
        self.dim = dim
        self.down = False
        self.delay = 0.0
        self.requests: list[dict] = []

    @property
    def openai_base_url(self) -> str:
        """What OPENAI_BASE_URL is set to (the SDK appends /embeddings)."""
        return self.base_url + "/v1"

    def inputs(self) -> list[str]:
        out: list[str] = []
        for body in self.requests:
            item = body.get("input")
            out.extend([item] if isinstance(item, str) else list(item or []))
        return out

    def _build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._h_embeddings)
        return app

    @staticmethod
    def _error(status: int, message: str, kind: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}},
                                 status=status)

    async def _h_embeddings(self, request: web.Request) -> web.Response:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error(401, "Incorrect API key provided", "invalid_request_error")
        body = await request.json()
        self.requests.append(body)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.down:
            return self._error(503, "The server is overloaded or not ready yet.", "server_error")
        items = body.get("input")
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list) or not items or not all(isinstance(t, str) and t for t in items):
            return self._error(400, "'input' must be a non-empty string or list of strings", "invalid_request_error")
        if not body.get("model"):
            return self._error(400, "you must provide a model parameter", "invalid_request_error")
        data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, self.concepts, self.dim)}
                for i, t in enumerate(items)]
        tokens = sum(len(t) // 4 + 1 for t in items)
        return web.Response(text=json.dumps({"object": "list", "data": data, "model": body["model"],
                                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
                            content_type="application/json")
