"""The model table: consolidation routing (one test per row of the spec's table) and caps."""

from __future__ import annotations

import pytest

from memory.models import UNKNOWN, caps, effective_model, route_consolidation_model


@pytest.mark.parametrize(
    "main, routed",
    [
        ("claude-opus-4-1", "claude-haiku-4-5"),            # claude-opus-*
        ("claude-opus-4-7", "claude-haiku-4-5"),
        ("claude-sonnet-4-6", "claude-haiku-4-5"),          # claude-sonnet-*
        ("claude-sonnet-4-5-20250929", "claude-haiku-4-5"),
        ("gemini-2.5-pro", "gemini-2.5-flash-lite"),        # gemini-*-pro
        ("gemini-2.5-flash", "gemini-2.5-flash-lite"),      # gemini-*-flash
        ("gemini-3.0-flash", "gemini-3.0-flash-lite"),
        ("gpt-4o", "gpt-4o-mini"),                          # gpt-4o
        ("gpt-5", "gpt-4o-mini"),                           # gpt-5*
        ("gpt-5.1-codex", "gpt-4o-mini"),
    ],
)
def test_routing_table_rows(main, routed):
    assert route_consolidation_model(main) == routed


@pytest.mark.parametrize("main", ["my-local-model", "claude-haiku-4-5", "gpt-4o-mini", "gemini-2.5-flash-lite", ""])
def test_unknown_or_already_cheap_routes_to_itself(main):
    assert route_consolidation_model(main) == main


def test_caps_forced_tools_and_sampling():
    assert caps("claude-haiku-4-5").forced_tool_use is True
    assert caps("claude-haiku-4-5").sampling_params is True
    assert caps("claude-sonnet-4-6").forced_tool_use is True
    # newer generations reject forced tool use and sampling parameters
    for m in ("claude-opus-4-7", "claude-opus-4-6-20260101"):
        c = caps(m)
        assert c.forced_tool_use is False
        assert c.sampling_params is False
        assert c.structured_outputs is True


def test_unknown_model_gets_conservative_caps():
    c = caps("some-new-model-9")
    assert c == UNKNOWN
    assert c.forced_tool_use is False and c.sampling_params is False and c.structured_outputs is True


def test_retired_model_replaced_by_successor():
    assert effective_model("claude-sonnet-4-5", "2026-11-29") == "claude-sonnet-4-5"
    assert effective_model("claude-sonnet-4-5", "2026-11-30") == "claude-sonnet-4-6"
    assert effective_model("claude-sonnet-4-6", "2030-01-01") == "claude-sonnet-4-6"
    assert effective_model("unknown-x", "2030-01-01") == "unknown-x"


@pytest.mark.parametrize("model, minimum", [
    ("claude-sonnet-4-6", 1024), ("claude-sonnet-4-5-20250929", 1024), ("claude-opus-4-1", 1024),
    ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096), ("claude-opus-4-7", 4096),
    ("claude-haiku-4-5", 4096), ("claude-3-5-haiku-latest", 2048), ("some-local-model", 1024),
])
def test_minimum_cacheable_prompt_per_model(model, minimum):
    """The documented minimum prefix Anthropic caches (prompt.py places no breakpoint below it)."""
    assert caps(model).cache_min_tokens == minimum
