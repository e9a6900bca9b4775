"""Issue 17, Low: ``ethan serve`` with a corrupt or locked database, and ``ethan memory import``
of a deeply nested file, printed a full traceback. Each now says what is wrong in one line
and exits non-zero. Real processes, real files, a real second connection holding the lock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from tests.reliability.support import REPO, problem_lines


def _run(tmp_path, *args, timeout=90):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "ETHAN_HOME": str(tmp_path), "ETHAN_PORT": "0"}
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
