"""Issue 17, Medium 2: webhook mode with neither an encrypt key nor a verification token
accepted forged events from anyone. It must refuse to start: one line naming the variables,
a non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.infra.config import ConfigError, load_settings
from tests.reliability.support import REPO


def _env(tmp_path, **extra):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "ETHAN_HOME": str(tmp_path), "ETHAN_PORT": "0",
           "LARK_APP_ID": "cli_x", "LARK_APP_SECRET": "s", "LARK_TRANSPORT": "webhook",
           "LARK_DOMAIN": "http://127.0.0.1:9"}
    env.update(extra)
    return env


def test_webhook_without_key_or_token_refuses_to_start(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bot", "serve"], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-800:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "LARK_ENCRYPT_KEY" in lines[0] and "LARK_VERIFICATION_TOKEN" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ethan.db").exists()          # refused before anything was opened


@pytest.mark.parametrize("secret", [{"lark_encrypt_key": "k"}, {"lark_verification_token": "t"}])
def test_one_secret_is_enough_and_ws_needs_none(tmp_path, secret):
    base = dict(_env_file=None, ethan_home=tmp_path, lark_app_id="cli_x", lark_app_secret="s")
    assert load_settings(**base, lark_transport="webhook", **secret).lark_transport == "webhook"
    assert load_settings(**base, lark_transport="ws").lark_transport == "ws"
    with pytest.raises(ConfigError, match="LARK_ENCRYPT_KEY or LARK_VERIFICATION_TOKEN"):
        load_settings(**base, lark_transport="webhook")
