"""Shared fixtures. Fakes live in tests/fakes (wire-level servers on loopback)."""

from __future__ import annotations

import pytest

from memory.db import Database


@pytest.fixture
async def db(tmp_path):
    database = await Database(tmp_path / "ethan.db").open()
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture(params=("anthropic", "openai"))
def model_provider(request):
    """Run a test on each model adapter: Harness() (and make_fake()) use this provider's fake
    and settings. Opt in per module: ``pytestmark = pytest.mark.usefixtures("model_provider")``."""
    import tests.harness as harness

    before = harness.default_provider
    harness.default_provider = request.param
    try:
        yield request.param
    finally:
        harness.default_provider = before
