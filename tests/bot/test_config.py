"""Settings: names, precedence (env > .env > config.yaml), one clear line for bad values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.config import ConfigError, load_settings

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    import os

    for k in list(os.environ):
        if k.startswith(("LARK_", "ETHAN_", "ANTHROPIC_")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults(clean_env):
    s = load_settings()
    assert s.lark_transport == "ws"
    assert s.lark_domain == "https://open.feishu.cn"
    assert s.ethan_model == "claude-sonnet-4-6"
    assert s.ethan_port == 8080 and s.ethan_host == "127.0.0.1"
    assert not s.lark_enabled and s.offline_model
    assert s.ethan_admins == []


@pytest.mark.parametrize("var,value,needle", [
    ("LARK_TRANSPORT", "carrier-pigeon", "LARK_TRANSPORT"),
    ("ETHAN_PORT", "70000", "ETHAN_PORT"),
    ("ETHAN_PORT", "eighty", "ETHAN_PORT"),
    ("ETHAN_ADMINS", "alice,bob", "ETHAN_ADMINS"),
    ("LARK_DOMAIN", "open.feishu.cn", "LARK_DOMAIN"),
    ("ETHAN_RESPOND_TO_ALL", "maybe", "ETHAN_RESPOND_TO_ALL"),
    ("ETHAN_HOST", "0.0.0.0", "ETHAN_CONSOLE_TOKEN"),
])
def test_bad_value_names_the_variable(clean_env, monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_admins_are_a_comma_list(clean_env, monkeypatch):
    monkeypatch.setenv("ETHAN_ADMINS", "ou_a1, ou_b2,,")
    assert load_settings().ethan_admins == ["ou_a1", "ou_b2"]


def test_precedence_env_then_dotenv_then_yaml(clean_env, monkeypatch):
    home = clean_env / "home"
    home.mkdir()
    (home / "config.yaml").write_text("ethan_model: from-yaml\nethan_port: 9001\nlark_domain: https://yaml.example\n")
    (clean_env / ".env").write_text("ETHAN_MODEL=from-dotenv\nETHAN_PORT=9002\n")
    monkeypatch.setenv("ETHAN_MODEL", "from-env")
    s = load_settings()
    assert s.ethan_model == "from-env"
    assert s.ethan_port == 9002
    assert s.lark_domain == "https://yaml.example"


def test_non_loopback_needs_console_token(clean_env, monkeypatch):
    monkeypatch.setenv("ETHAN_HOST", "0.0.0.0")
    monkeypatch.setenv("ETHAN_CONSOLE_TOKEN", "s3cret")
    assert not load_settings().host_is_loopback


def test_cli_bad_value_is_one_line_not_a_traceback(clean_env):
    env = {"PATH": "/usr/bin:/bin", "ETHAN_HOME": str(clean_env / "home"), "LARK_TRANSPORT": "smoke"}
    r = subprocess.run([sys.executable, "-m", "bot", "serve"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "LARK_TRANSPORT" in r.stderr and "Traceback" not in r.stderr


def test_redacted_hides_secrets(clean_env, monkeypatch):
    monkeypatch.setenv("LARK_APP_SECRET", "very-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-xyz")
    out = str(load_settings().redacted())
    assert "very-secret" not in out and "sk-ant-xyz" not in out
