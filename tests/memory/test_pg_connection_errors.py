"""PostgreSQL connection errors say which kind they are — the login refused, the database
missing, the server unreachable — in one line without the password (issue 32), and psycopg's
pool, reconnecting with a password that has a raw space, never writes that password into a log
record. Against the suite's throwaway cluster (tests/pg_cluster.py), at the wire."""

from __future__ import annotations

import logging
import socket

import psycopg
import pytest

from storage import DatabaseUnavailable, database

PASSWORD = "s3cret pass word"     # a raw space, as an operator pasted it


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def role(pg_cluster) -> str:
    pg_cluster.password_role("pwuser", PASSWORD)
    return "pwuser"


def _url(pg_cluster, user: str, password: str, dbname: str) -> str:
    return f"postgresql://{user}:{password}@127.0.0.1:{pg_cluster.port}/{dbname}"


async def _refusal(url: str) -> DatabaseUnavailable:
    with pytest.raises(DatabaseUnavailable) as info:
        db = await database(url, connect_timeout=2).open()
        await db.close()
    return info.value


async def test_a_wrong_password_is_a_refused_login_not_unreachable(pg_cluster, db_target, role):
    dbname = str(db_target).rsplit("/", 1)[1]
    err = await _refusal(_url(pg_cluster, role, "wrong pass word", dbname))
    assert err.kind == "auth" and "refused the login" in str(err) and "unreachable" not in str(err)
    assert "wrong pass" not in str(err) and "pass word" not in str(err)


async def test_a_missing_database_says_so(pg_cluster, role):
    err = await _refusal(_url(pg_cluster, role, PASSWORD, "no_such_db"))
    assert err.kind == "missing" and "no such database" in str(err), str(err)
    assert PASSWORD not in str(err) and "pass word" not in str(err)


async def test_no_server_is_unreachable():
    with socket.socket() as s:       # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = await _refusal(f"postgresql://pwuser:{PASSWORD}@127.0.0.1:{port}/x")
    assert err.kind == "unreachable" and "unreachable" in str(err)
    assert "pass word" not in str(err)


async def test_a_password_with_a_raw_space_logs_in_and_never_reaches_the_pool_log(pg_cluster, db_target, role,
                                                                                  caplog):
    dbname = str(db_target).rsplit("/", 1)[1]
    db = await database(_url(pg_cluster, role, PASSWORD, dbname), pool_size=2, connect_timeout=2).open()
    try:
        await db.ping()                                   # the raw space: logged in all the same
        caplog.set_level(logging.DEBUG, logger="psycopg")
        # The password changes under the running pool and its connections are cut: every
        # reconnect the pool tries now is refused, and it says so in warnings.
        pg_cluster.admin(f"ALTER ROLE {role} PASSWORD 'another one'")
        pg_cluster.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        with pytest.raises(DatabaseUnavailable) as info:
            for _ in range(3):
                await db.ping()
        assert PASSWORD not in str(info.value) and "pass word" not in str(info.value)
    finally:
        await db.close()
        pg_cluster.admin(f"ALTER ROLE {role} PASSWORD '{PASSWORD}'")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert any(r.name.startswith("psycopg") for r in caplog.records), "the pool logged nothing"
    assert PASSWORD not in text and "pass word" not in text and "word@" not in text, text


def test_the_driver_itself_echoes_a_raw_space_password_from_a_url(pg_cluster):
    """Why the engine never hands libpq the URL: libpq's URI parser fails on the raw space and
    puts the rest of the string into its message (the defect this file guards against)."""
    with pytest.raises(psycopg.Error) as info:
        psycopg.connect(f"postgresql://pwuser:{PASSWORD}@127.0.0.1:{pg_cluster.port}/postgres", connect_timeout=2)
    assert "word" in str(info.value)


async def test_compose_gives_the_replicas_a_password_with_url_characters_that_logs_in(pg_cluster, db_target,
                                                                                       monkeypatch):
    """deploy/compose.yaml's replica environment, its ${POSTGRES_PASSWORD} filled with a password
    holding / + @ : (issue 52: put raw into the URL, the `/` ended the host part and the login
    failed), pointed at the throwaway cluster: the settings it makes log in."""
    from urllib.parse import urlsplit

    import yaml

    from bot.infra.config import load_settings
    from tests.test_deploy import COMPOSE, _interpolated

    tricky = "p/a+s@s:w0rd/+@:"
    service = yaml.safe_load(COMPOSE.read_text())["services"]["ethan-1"]
    env = {k: _interpolated(v, POSTGRES_PASSWORD=tricky) for k, v in service["environment"].items()}
    parts = urlsplit(env["ETHAN_DATABASE_URL"])
    assert parts.hostname == "postgres", env["ETHAN_DATABASE_URL"]
    pg_cluster.password_role(parts.username, tricky)      # scram over TCP: the password is checked
    dbname = str(db_target).rsplit("/", 1)[1]
    env["ETHAN_DATABASE_URL"] = parts._replace(
        netloc=parts.netloc.replace("postgres:5432", f"127.0.0.1:{pg_cluster.port}"), path=f"/{dbname}").geturl()
    for key, value in env.items():
        monkeypatch.setenv(key, value)                      # as the container's environment
    settings = load_settings(_env_file=None, ethan_console_token="t" * 32)
    db = await database(settings.database_target, pool_size=1, connect_timeout=2).open()
    try:
        await db.ping()
    finally:
        await db.close()
