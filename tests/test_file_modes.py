"""Files under ETHAN_HOME are its user's only — directories 0700, files 0600 — whatever the
umask of the shell that runs `ethan` (issue 30: `make run` left ethan.db and backups 0644)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.test_deploy import ROOT, _clean_env


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _ethan(home: Path, *args: str, cwd: Path, **kw) -> subprocess.Popen:
    env = _clean_env(home, ETHAN_HOST="127.0.0.1", ETHAN_PORT="0", OPENAI_API_KEY="", OPENAI_BASE_URL="")
    return subprocess.Popen([sys.executable, "-m", "bot", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.umask(0o022), **kw)


def test_serve_and_backup_make_private_files_under_a_permissive_umask(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)               # as an earlier version left it
    proc = _ethan(home, "serve", cwd=tmp_path)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            line = proc.stderr.readline()
            assert line, "ethan serve ended before app.ready"
            if json.loads(line).get("event") == "app.ready":
                break
        # the running server's files: the database and its WAL
        files = [p for p in home.rglob("*") if p.is_file()]
        assert any(p.name == "ethan.db-wal" for p in files), files
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    backup = _ethan(home, "backup", str(home / "backups") + "/", cwd=tmp_path)
    out, err = backup.communicate(timeout=60)
    assert backup.returncode == 0, err
    dirs = [home, *(p for p in home.rglob("*") if p.is_dir())]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.parent.name == "backups" for p in files), files
    assert {str(p.relative_to(tmp_path)): oct(_mode(p)) for p in dirs if _mode(p) != 0o700} == {}
    assert {str(p.relative_to(tmp_path)): oct(_mode(p)) for p in files if _mode(p) != 0o600} == {}


def test_the_docs_say_so():
    text = (ROOT / "docs" / "operations.md").read_text()
    assert "0700" in text and "0600" in text and "umask" in text
