"""Fixtures of the reliability suite: the wire fakes, a server subprocess, log capture."""

from __future__ import annotations

import os
import random

import pytest

from tests.fakes.fake_anthropic import running_model
from tests.fakes.fake_lark import FakeLark
from tests.reliability.support import LogCapture, ServerProcess


@pytest.fixture
def lark():
    fake = FakeLark().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def model():
    with running_model() as fake:
        yield fake


@pytest.fixture
def server(tmp_path, lark, model):
    """A factory: ``server(**env)`` -> ServerProcess (killed at teardown if still running)."""
    made: list[ServerProcess] = []

    def make(home=None, **env) -> ServerProcess:
        srv = ServerProcess(home or tmp_path / "home", lark, model, **env)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


@pytest.fixture
def logs():
    with LogCapture() as cap:
        yield cap


@pytest.fixture
def rng(request):
    """A seeded random generator; the seed is printed so a failure can be replayed with
    RELIABILITY_SEED=<seed>."""
    seed = int(os.environ.get("RELIABILITY_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\n[{request.node.name}] RELIABILITY_SEED={seed}")
    return random.Random(seed)
