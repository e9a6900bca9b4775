"""Model adapters behind the port (``memory/llm.py``) and the wiring the app uses.

- ``anthropic_model``: Anthropic Messages (and the built-in offline model, which speaks it);
- ``openai_model``: any OpenAI-compatible Chat Completions endpoint;
- ``ModelChain``: the main model and its ``ETHAN_FALLBACK_MODELS``, one ``ChatModel``;
- ``build_models``: one client per provider, the chat chain and the routed consolidation
  model, from Settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from bot.llm.policy import StructuredModes, log
from memory.llm import FALLBACK_KINDS, ChatModel, ModelFailure, ModelRequest, ModelResponse, OnText, Usage
from memory.models import route_consolidation_model

# With fallbacks configured, a model that is not the last may use this share of the time
# left, so the next one still has time to answer the same turn (a stall would take it all).
FIRST_SHARE = 0.5


class ModelChain:
    """The main model, then each fallback in order, for failures a fallback may answer
    (``memory.llm.FALLBACK_KINDS``: overloaded, down, rate-limited past the deadline, timing
    out — never a bad request or a spend limit). Streaming: every model streams the whole
    text so far, so a fallback's text replaces a failed model's partial text instead of
    being added to it."""

    def __init__(self, models: list[ChatModel], *,
                 on_response: Callable[[ModelResponse], None] | None = None,
                 on_fallback: Callable[[ChatModel, ChatModel, str], None] | None = None) -> None:
        if not models:
            raise ValueError("a chain needs a model")
        self.models = models
        self.on_response = on_response
        self.on_fallback = on_fallback

    @property
    def name(self) -> str:
        return self.models[0].name

    @property
    def provider(self) -> str:
        return self.models[0].provider

    async def turn(self, request: ModelRequest, *, on_text: OnText | None = None,
                   deadline: float) -> ModelResponse:
        for i, model in enumerate(self.models):
            last = i == len(self.models) - 1
            now = time.monotonic()
            until = deadline if last else now + max(0.0, deadline - now) * FIRST_SHARE
            try:
                response = await model.turn(request, on_text=on_text, deadline=until)
            except ModelFailure as failure:
                if last or failure.kind not in FALLBACK_KINDS:
                    raise
                nxt = self.models[i + 1]
                log.warning("model.fallback", failed_model=model.name, failed_provider=model.provider,
                            kind=failure.kind, status=failure.status, next_model=nxt.name,
                            next_provider=nxt.provider)
                if self.on_fallback is not None:
                    self.on_fallback(model, nxt, failure.kind)
                continue
            if self.on_response is not None:
                self.on_response(response)
            return response
        raise AssertionError("unreachable")

    async def check(self) -> None:
        await self.models[0].check()   # type: ignore[attr-defined]


class UsageBook:
    """Tokens and answers per (provider, model) since start, for /stats."""

    def __init__(self) -> None:
        self.by_model: dict[tuple[str, str], list] = {}

    def add(self, response: ModelResponse) -> None:
        key = (response.provider, response.model)
        entry = self.by_model.setdefault(key, [0, Usage()])
        entry[0] += 1
        entry[1] = entry[1] + response.usage

    def rows(self) -> list[tuple[str, str, int, Usage]]:
        return [(p, m, n, u) for (p, m), (n, u) in sorted(self.by_model.items())]


@dataclass
class Models:
    chat: ModelChain
    consolidation: ModelChain
    clients: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        for c in self.clients:
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                log.warning("model.client_close_failed", client=type(c).__name__)


def build_models(settings: Any, *, offline_base_url: str | None = None, offline_api_key: str = "",
                 on_response: Callable[[ModelResponse], None] | None = None,
                 on_fallback: Callable[[ChatModel, ChatModel, str], None] | None = None) -> Models:
    """The chat chain (main model + fallbacks) and the consolidation model, one client per
    provider. ``offline_base_url``: where the built-in offline model is served, used when
    the main provider has no key (``settings.offline_model``)."""
    clients: dict[str, Any] = {}
    modes = StructuredModes()

    def model_for(provider: str, name: str) -> ChatModel:
        p = settings.provider_config(provider)
        offline = offline_base_url is not None and settings.offline_model and provider == settings.provider
        kind = "anthropic" if offline else p.kind
        if provider not in clients:
            if kind == "anthropic":
                from bot.llm.anthropic_model import make_client

                clients[provider] = make_client(api_key=offline_api_key if offline else p.api_key,
                                                base_url=offline_base_url if offline else (p.base_url or None))
            else:
                from bot.llm.openai_model import make_client

                clients[provider] = make_client(api_key=p.api_key, base_url=p.base_url or None)
        if kind == "anthropic":
            from bot.llm.anthropic_model import AnthropicChatModel

            return AnthropicChatModel(clients[provider], name, provider=provider, modes=modes)
        from bot.llm.openai_model import OpenAIChatModel

        return OpenAIChatModel(clients[provider], name, provider=provider, modes=modes)

    main_provider, main_name = settings.model_ref(settings.ethan_model, "ETHAN_MODEL")
    offline = offline_base_url is not None and settings.offline_model
    if offline:
        # the offline model answers under its own name, so sessions, summaries and episodes
        # record who wrote them (not the claude-haiku-4-5 a Claude model would route to)
        from bot.offline.server import MODEL_NAME as OFFLINE_NAME

        main_name = OFFLINE_NAME
    main = model_for(main_provider, main_name)
    chain = [main]
    if not settings.offline_model:
        for ref in settings.ethan_fallback_models:
            chain.append(model_for(*settings.model_ref(ref, "ETHAN_FALLBACK_MODELS")))
    if settings.ethan_consolidation_model:
        c_provider, c_name = settings.model_ref(settings.ethan_consolidation_model, "ETHAN_CONSOLIDATION_MODEL")
    else:
        # The seed's routing table, on the main model's provider (the retired-model successor
        # is what is routed: it is what answers).
        c_provider, c_name = main_provider, route_consolidation_model(main.name)
    if offline:
        c_provider, c_name = main_provider, main_name
    consolidation = model_for(c_provider, c_name)
    return Models(chat=ModelChain(chain, on_response=on_response, on_fallback=on_fallback),
                  consolidation=ModelChain([consolidation], on_response=on_response),
                  clients=list(clients.values()))


__all__ = ["FIRST_SHARE", "ModelChain", "Models", "UsageBook", "build_models"]
