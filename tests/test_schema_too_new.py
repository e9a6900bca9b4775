"""What an old replica does with a newer schema (docs/operations.md "Scaling out", upgrades one
replica at a time): `ethan serve` refuses to start in one line, exit code 1, and leaves the
database as it was — on both backends. On PostgreSQL the line names the server and database,
never the URL (it may carry a password)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import database
from tests.conftest import BACKENDS
from tests.reliability.support import problem_lines

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


async def _bump(target, to: int | None = None) -> tuple[int, int]:
    """Mark the database as migrated by a newer Ethan; returns (this Ethan's version, the new one)."""
    db = await database(target).open()
    try:
        ours = await db.schema_version()
        newer = to or ours + 1
        await db.execute("INSERT INTO schema_version(version, applied_at) VALUES (?, ?)", (newer, time.time()))
        return ours, newer
    finally:
        await db.close()


def test_an_older_ethan_refuses_a_newer_schema_in_one_line(tmp_path, db_target, backend):
    url = ""
    if backend == "postgres":
        # trust authentication ignores the password: it is here to be kept out of the output
        url = str(db_target).replace("postgresql://postgres@", "postgresql://postgres:hunter2@")
        assert "hunter2" in url
    target = url or db_target
    home = tmp_path if backend == "postgres" else Path(db_target).parent
    ours, newer = asyncio.run(_bump(target))

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ETHAN_HOME": str(home), "ETHAN_PORT": "0",
           "ETHAN_DATABASE_URL": url}
    proc = subprocess.run([sys.executable, "-m", "bot", "serve"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = problem_lines(proc.stderr)
    assert line.startswith("ethan: cannot start: database "), line
    assert f"schema version {newer}, newer than this Ethan understands ({ours})" in line, line
    if backend == "postgres":
        assert "hunter2" not in proc.stderr and "PostgreSQL 127.0.0.1:" in line, line
    else:
        assert str(db_target) in line, line

    # the refusing start changed nothing
    if backend == "postgres":
        import psycopg
        with psycopg.connect(url) as conn:
            after = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    else:
        conn = sqlite3.connect(str(db_target))
        try:
            after = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        finally:
            conn.close()
    assert after == newer
