"""Shared fixtures. Fakes live in tests/fakes (wire-level servers on loopback).

``db`` is the one Database port on the backend ``backend`` names: ``sqlite`` by default; the
store contract suites (tests/memory, test_export, test_erase, …) override ``backend`` with
both, like aiogram's storage tests, so every store test runs on SQLite and on PostgreSQL.
App-level tests marked ``app_backends`` run their apps on both too (``app_backend``);
``--backend=postgres`` runs every app on PostgreSQL.
"""

from __future__ import annotations

import pytest

from storage import Database, database

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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "app_backends: the apps this test starts run on SQLite and on PostgreSQL "
                   "(two variants), unless --backend=postgres already runs everything there")


def pytest_generate_tests(metafunc):
    """Tests marked ``app_backends`` (the app-level memory paths: agent, memory layers, inbox,
    recall/erase through Lark) get a SQLite and a PostgreSQL variant in every `make test`.
    A module whose app is module-scoped asks for ``module_backend`` instead (one app per
    backend for the whole module)."""
    if (not metafunc.definition.get_closest_marker("app_backends")
            or metafunc.config.getoption("--backend") != "sqlite"):
        return
    if "module_backend" in metafunc.fixturenames:
        metafunc.parametrize("module_backend", BACKENDS, scope="module")
    elif "app_backend" in metafunc.fixturenames:
        metafunc.parametrize("app_backend", BACKENDS, indirect=True)


@pytest.fixture(scope="module")
def module_backend(request) -> str:
    """The backend of a module-scoped app (parametrised under the ``app_backends`` marker)."""
    return request.config.getoption("--backend")


@pytest.fixture(scope="module")
def module_database_url(module_backend, request) -> str:
    """A module-scoped app's own database: ``""`` (SQLite in its home) or a fresh PostgreSQL
    database's URL (sync, so the cluster's first start runs outside any event loop)."""
    if module_backend != "postgres":
        return ""
    return request.getfixturevalue("pg_cluster").new_database()


@pytest.fixture
def app_backend(request) -> str:
    """The backend of the apps (and of the default ``db``) this test starts."""
    return getattr(request, "param", None) or request.config.getoption("--backend")


@pytest.fixture
def backend(app_backend) -> str:
    return app_backend


@pytest.fixture(autouse=True)
def _app_database(request, app_backend):
    """On PostgreSQL (--backend=postgres, or a test's ``app_backends`` variant), each test's
    apps share one fresh PostgreSQL database."""
    if app_backend != "postgres":
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


@pytest.fixture
def stt():
    """A fake speech-to-text server (tests/fakes/fake_stt.py) on loopback, for voice messages."""
    from tests.fakes.fake_stt import FakeSTT

    fake = FakeSTT(api_key="sk-stt").start()
    try:
        yield fake
    finally:
        fake.stop()
