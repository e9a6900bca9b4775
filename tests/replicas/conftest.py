"""Fixtures of the replica tests: one fake Lark and one echoing fake model shared by every
replica, a :class:`tests.replicas.fleet.Fleet` on a fresh database of the session's cluster,
and (for the restart test) a cluster of the test's own."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import pytest

from tests.delay_proxy import DelayProxyProcess
from tests.fakes.fake_anthropic import Text, running_model, user_texts
from tests.reliability.conftest import lark  # noqa: F401 - the same fake Lark fixture
from tests.replicas.fleet import Fleet

# 2 ms a round trip between every replica and PostgreSQL (TEST_DB_ONE_WAY_S=0: straight to it)
DB_ONE_WAY_S = float(os.environ.get("TEST_DB_ONE_WAY_S", "0.001"))
TOKEN = re.compile(r"\b[a-z]+-c\d{2}-n\d{3}\b")


def echo(req: dict) -> Text:
    """``echo: <this message's token> after <the previous user message's token, or ->``: a
    reply says what it answers and what the model had seen before it, so a test can check
    each chat's order from the replies alone."""
    tokens = [t for text in user_texts(req) for t in TOKEN.findall(text)]
    this = tokens[-1] if tokens else "?"
    before = tokens[-2] if len(tokens) > 1 else "-"
    return Text(f"echo: {this} after {before}")


@pytest.fixture
def model():
    with running_model(echo) as fake:
        yield fake


@pytest.fixture(scope="module")
def own_cluster(pg_cluster):
    """A cluster the module's tests may stop and start (the session's is shared by other
    tests); each test leaves it running. ``pg_cluster`` first, for its one-line install hint
    when the binaries are missing. Durable: a crash stop must not lose acknowledged commits."""
    from tests.pg_cluster import Cluster
    cluster = Cluster(pg_cluster.bindir, durable=True).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_database(own_cluster) -> str:
    """A fresh, empty database on ``own_cluster`` (the first replica migrates it)."""
    return own_cluster.new_database(template="template1")


@pytest.fixture
def fleet_on(tmp_path, lark, model):   # noqa: F811
    """``fleet_on(database_url)`` -> a Fleet; every replica is killed at teardown. The replicas
    reach PostgreSQL through the delay proxy (tests/delay_proxy.py: ``DB_ONE_WAY_S`` each way, a
    database on another host), so what they promise holds with real round trips too; the
    tests themselves read and restart the cluster directly."""
    made: list[Fleet] = []
    proxies: dict[int, DelayProxyProcess] = {}

    def make(url: str, **env) -> Fleet:
        port = int(urlsplit(url).port)
        if DB_ONE_WAY_S <= 0:
            f = Fleet(tmp_path, lark, model, url, **env)
            made.append(f)
            return f
        if port not in proxies:
            proxies[port] = DelayProxyProcess(port, DB_ONE_WAY_S)
        f = Fleet(tmp_path, lark, model, proxies[port].through(url), **env)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()
    for p in proxies.values():
        p.close()


@pytest.fixture
def fleet(fleet_on, pg_cluster) -> Fleet:
    return fleet_on(pg_cluster.new_database())
