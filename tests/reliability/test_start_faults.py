"""Issue 17, Low: ``ethan serve`` with a corrupt or locked database, and ``ethan memory import``
of a deeply nested file, printed a full traceback. Each now says what is wrong in one line
and exits non-zero. Real processes, real files, a real second connection holding the lock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from tests.reliability.support import REPO, problem_lines


def _run(tmp_path, *args, timeout=90, **extra_env):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "ETHAN_HOME": str(tmp_path), "ETHAN_PORT": "0",
           **extra_env}
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _check_one_line(proc, *words):
    assert proc.returncode not in (0, None), proc.returncode
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    lines = problem_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert all(w in lines[0] for w in words), lines[0]


def test_serve_with_a_corrupt_database_says_so_in_one_line(tmp_path):
    (tmp_path / "ethan.db").write_bytes(b"this is not a database at all" * 300)
    _check_one_line(_run(tmp_path, "serve"), "ethan: cannot start: database", "not a database")


def test_serve_with_a_database_another_process_holds_locked(tmp_path):
    # A real database first (the server's own migrations), then a second process's write lock.
    made = _run(tmp_path, "session", "list")
    assert made.returncode in (0, 1), made.stderr
    conn = sqlite3.connect(str(tmp_path / "ethan.db"))
    try:
        conn.execute("PRAGMA journal_mode=DELETE")      # readers need the lock too: startup cannot read
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("CREATE TABLE IF NOT EXISTS _held(x)")
        _check_one_line(_run(tmp_path, "serve"), "ethan: cannot start: database", "locked")
    finally:
        conn.rollback()
        conn.close()


def test_memory_import_of_a_deeply_nested_file_is_one_line(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "facts.json").write_text("[" * 200_000 + "]" * 200_000)
    proc = _run(tmp_path, "memory", "import", "--user", "ou_alice", str(bundle))
    _check_one_line(proc, "facts.json", "nested")


# Issue 45 N13: an unknown query parameter reached psycopg as a keyword argument (a
# ProgrammingError traceback), a port urllib cannot read raised in the error handler itself
# (a ValueError traceback), connect_timeout collided with Ethan's own (a TypeError traceback).
BAD_URLS = {
    "postgresql://ethan:s3cretpw@127.0.0.1:5999/ethan?foo=bar": "'foo' in the URL's query",
    "postgresql://ethan:s3cretpw@127.0.0.1:5432x/ethan": "the port is not a number",
    "postgres://ethan:s3cretpw@127.0.0.1:99999/ethan": "the port is not a number",
    "postgresql://ethan:s3cretpw@127.0.0.1:5999/ethan?connect_timeout=3": "leave connect_timeout out",
    "postgresql://ethan:s3cretpw@[::1/ethan": "not a URL",
    "postgresql://ethan:s3cretpw/ethan": "the port is not a number",       # no @: the password where the port goes
    "mysql://ethan:s3cretpw@127.0.0.1/ethan": "not a supported database",
}


@pytest.mark.parametrize("url", list(BAD_URLS))
def test_serve_with_a_bad_database_url_is_refused_in_one_line(tmp_path, url):
    proc = _run(tmp_path, "serve", ETHAN_DATABASE_URL=url)
    _check_one_line(proc, "ethan: configuration error: ETHAN_DATABASE_URL", BAD_URLS[url])
    assert "s3cretpw" not in proc.stderr + proc.stdout
