"""Shared fixtures. Fakes live in tests/fakes (wire-level servers on loopback).

``db`` is the one Database port on the backend ``backend`` names: ``sqlite`` by default; the
store contract suites (tests/memory, test_export, test_erase, …) override ``backend`` with
both, like aiogram's storage tests, so every store test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import pytest

from memory.db import Database, database

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(scope="session")
def pg_cluster():
    from tests.pg_cluster import INSTALL_HINT, Cluster, find_bindir
    bindir = find_bindir()
    if bindir is None:
        pytest.exit(INSTALL_HINT, returncode=3)   # one line, never a silent skip
    cluster = Cluster(bindir).start()
    try:
        cluster.migrated_template()
        yield cluster
    finally:
        cluster.stop()


def pytest_addoption(parser):
    parser.addoption("--backend", choices=BACKENDS, default="sqlite",
                     help="the backend of every app the tests start and of the default `db` "
                          "(the store contract suites run on both regardless)")


@pytest.fixture
def backend(request) -> str:
    return request.config.getoption("--backend")


@pytest.fixture(autouse=True)
def _app_database(request):
    """Under --backend=postgres, each test's apps share one fresh PostgreSQL database."""
    if request.config.getoption("--backend") != "postgres":
        yield
        return
    from tests import harness
    harness.DATABASE_URL["url"] = request.getfixturevalue("pg_cluster").new_database()
    try:
        yield
    finally:
        harness.DATABASE_URL["url"] = ""


@pytest.fixture
def db_target(backend, tmp_path, request):
    """Where a test's database lives: a SQLite path, or a fresh PostgreSQL database's URL."""
    if backend == "postgres":
        return request.getfixturevalue("pg_cluster").new_database()
    return tmp_path / "ethan.db"


@pytest.fixture
async def db(db_target) -> Database:
    d = await database(db_target).open()
    try:
        yield d
    finally:
        await d.close()


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
