"""What each model generation accepts, in one table, and the consolidation routing.

Unknown model names never break a reply: they get conservative defaults
(no forced tool use assumed, no sampling parameters) and route to themselves.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelCaps:
    forced_tool_use: bool = True        # tool_choice={"type": "tool", ...} accepted
    sampling_params: bool = True        # temperature / top_p accepted (the 2.x SDK sends none; kept for older gateways)
    structured_outputs: bool = True     # output_config.format json_schema accepted
    retired_on: str = ""                # ISO date the model reached end of life
    successor: str = ""                 # what to use instead once retired
    cache_min_tokens: int = 1024        # shortest prompt prefix the provider caches (Anthropic docs)
    # Chat Completions: OpenAI's own models take (reasoning ones: only take) max_completion_tokens;
    # most compatible servers know only max_tokens.
    max_tokens_field: str = "max_tokens"
    vision: bool = True                 # reads image blocks (without: a text note instead of the image)


# First match wins; patterns are fnmatch-style on the model id.
CAPABILITIES: list[tuple[str, ModelCaps]] = [
    ("claude-sonnet-4-5*", ModelCaps(retired_on="2026-11-30", successor="claude-sonnet-4-6")),
    ("claude-opus-4-7*", ModelCaps(forced_tool_use=False, sampling_params=False, cache_min_tokens=4096)),
    ("claude-opus-4-6*", ModelCaps(forced_tool_use=False, sampling_params=False, cache_min_tokens=4096)),
    ("claude-opus-4-5*", ModelCaps(cache_min_tokens=4096)),
    ("claude-opus-*", ModelCaps()),
    ("claude-sonnet-*", ModelCaps()),
    ("claude-haiku-4-5*", ModelCaps(cache_min_tokens=4096)),
    ("claude-3-5-haiku*", ModelCaps(cache_min_tokens=2048)),
    ("claude-haiku-*", ModelCaps()),
    ("ethan-offline*", ModelCaps()),
    # OpenAI (Chat Completions): reasoning models reject temperature other than the default.
    ("gpt-5*", ModelCaps(sampling_params=False, max_tokens_field="max_completion_tokens")),
    ("o[1-9]*", ModelCaps(sampling_params=False, max_tokens_field="max_completion_tokens")),
    ("gpt-4*", ModelCaps(max_tokens_field="max_completion_tokens")),
    # OpenAI-compatible providers, as their own documentation describes them (README
    # "Choosing a model"); anything a 400 rejects is learned at run time anyway.
    ("gemini-*", ModelCaps()),                                   # named tool_choice and json_schema
    ("deepseek-*", ModelCaps(structured_outputs=False, vision=False)),   # response_format: json_object only; text only
    ("qwen*", ModelCaps(forced_tool_use=False)),
    ("glm-*", ModelCaps(forced_tool_use=False, structured_outputs=False)),     # tool_choice: auto only
    ("kimi-*", ModelCaps(forced_tool_use=False, structured_outputs=False, vision=False)),
    ("moonshot-*", ModelCaps(forced_tool_use=False, structured_outputs=False, vision=False)),
    ("doubao-*", ModelCaps(forced_tool_use=False)),
]
UNKNOWN = ModelCaps(forced_tool_use=False, sampling_params=False, structured_outputs=True, vision=False)

# The spec's table: main model -> cheaper consolidation model.
ROUTES: list[tuple[str, str]] = [
    ("claude-opus-*", "claude-haiku-4-5"),
    ("claude-sonnet-*", "claude-haiku-4-5"),
    ("gemini-*-pro", "gemini-*-flash-lite"),
    ("gemini-*-flash", "gemini-*-flash-lite"),
    ("gpt-4o", "gpt-4o-mini"),
    ("gpt-5*", "gpt-4o-mini"),
]


def caps(model: str) -> ModelCaps:
    for pattern, c in CAPABILITIES:
        if fnmatch.fnmatchcase(model, pattern):
            return c
    return UNKNOWN


def effective_model(model: str, today: str) -> str:
    """The model to call: a retired model is replaced by its successor."""
    c = caps(model)
    if c.retired_on and today >= c.retired_on and c.successor:
        return c.successor
    return model


def route_consolidation_model(main_model: str) -> str:
    """Routed consolidation model; gemini's ``*`` keeps the version; unknown -> itself."""
    for pattern, target in ROUTES:
        if fnmatch.fnmatchcase(main_model, pattern):
            if "*" in target:
                # gemini-2.5-pro -> gemini-2.5-flash-lite: carry the wildcard part over
                middle = main_model[len("gemini-"):].rsplit("-", 1)[0]
                return target.replace("*", middle)
            return target
    return main_model
