"""Settings: names, precedence (env > .env > config.yaml), one clear line for bad values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.infra.config import ConfigError, load_settings

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    import os

    for k in list(os.environ):
        if k.startswith(("LARK_", "ETHAN_", "ANTHROPIC_", "OPENAI_")):
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


# -- providers and models (DESIGN §3) ------------------------------------------------------

def test_provider_default_and_openai_when_only_its_key_is_set(clean_env, monkeypatch):
    assert load_settings().provider == "anthropic"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    s = load_settings()
    assert s.provider == "openai" and not s.offline_model
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    assert load_settings().provider == "anthropic"
    monkeypatch.setenv("ETHAN_PROVIDER", "openai")
    assert load_settings().provider == "openai"


def test_a_base_url_alone_is_a_configured_openai_endpoint(clean_env, monkeypatch):
    # Ollama and vLLM take no key
    monkeypatch.setenv("ETHAN_PROVIDER", "openai")
    assert load_settings().offline_model
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    assert not load_settings().offline_model


@pytest.mark.parametrize("var,value,needle", [
    ("ETHAN_PROVIDER", "azure", "ETHAN_PROVIDER"),
    ("ETHAN_FALLBACK_MODELS", "gpt-4o-mini", "ETHAN_FALLBACK_MODELS"),
    ("ETHAN_FALLBACK_MODELS", "nowhere:gpt-4o-mini", "ETHAN_FALLBACK_MODELS"),
    ("OPENAI_BASE_URL", "api.deepseek.com", "OPENAI_BASE_URL"),
    ("ETHAN_MODEL", "openai:", "ETHAN_MODEL"),
])
def test_bad_model_settings_name_the_variable(clean_env, monkeypatch, var, value, needle):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_named_providers_from_config_yaml(clean_env, monkeypatch):
    home = clean_env / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "providers:\n"
        "  deepseek: {kind: openai, base_url: 'https://api.deepseek.com', api_key_env: DEEPSEEK_API_KEY}\n"
        "  ollama: {kind: openai, base_url: 'http://localhost:11434/v1'}\n"
        "ethan_consolidation_model: deepseek:deepseek-chat\n"
        "ethan_fallback_models: ollama:qwen2.5:7b, openai:gpt-4o-mini\n")
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-ds")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    s = load_settings()
    assert s.model_ref(s.ethan_model) == ("anthropic", "claude-sonnet-4-6")
    assert s.model_ref(s.ethan_consolidation_model) == ("deepseek", "deepseek-chat")
    assert [s.model_ref(r) for r in s.ethan_fallback_models] == [("ollama", "qwen2.5:7b"), ("openai", "gpt-4o-mini")]
    ds = s.provider_config("deepseek")
    assert (ds.kind, ds.base_url, ds.api_key, ds.key_setting) == ("openai", "https://api.deepseek.com", "sk-ds",
                                                                 "DEEPSEEK_API_KEY")
    assert s.model_ref("qwen2.5:7b") == ("anthropic", "qwen2.5:7b")     # no such provider: part of the id


@pytest.mark.parametrize("yaml_text,needle", [
    ("providers:\n  x: {kind: gemini}\n", "PROVIDERS"),
    ("providers:\n  openai: {kind: openai}\n", "PROVIDERS"),
    ("providers:\n  x: {kind: openai, base_url: nope}\n", "PROVIDERS"),
])
def test_bad_providers_name_the_setting(clean_env, yaml_text, needle):
    home = clean_env / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("env,chat,consolidation", [
    ({"ANTHROPIC_API_KEY": "k"}, ("anthropic", "claude-sonnet-4-6"), ("anthropic", "claude-haiku-4-5")),
    ({"OPENAI_API_KEY": "k", "ETHAN_MODEL": "gpt-4o"}, ("openai", "gpt-4o"), ("openai", "gpt-4o-mini")),
    ({"OPENAI_API_KEY": "k", "ETHAN_MODEL": "gpt-5.1"}, ("openai", "gpt-5.1"), ("openai", "gpt-4o-mini")),
    ({"OPENAI_API_KEY": "k", "ETHAN_MODEL": "gemini-2.5-pro"}, ("openai", "gemini-2.5-pro"),
     ("openai", "gemini-2.5-flash-lite")),
    ({"OPENAI_API_KEY": "k", "ETHAN_MODEL": "gemini-2.5-flash"}, ("openai", "gemini-2.5-flash"),
     ("openai", "gemini-2.5-flash-lite")),
    ({"OPENAI_API_KEY": "k", "ETHAN_MODEL": "deepseek-chat"}, ("openai", "deepseek-chat"), ("openai", "deepseek-chat")),
    ({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k", "ETHAN_CONSOLIDATION_MODEL": "openai:gpt-4o-mini"},
     ("anthropic", "claude-sonnet-4-6"), ("openai", "gpt-4o-mini")),
])
async def test_routing_table_on_every_provider(clean_env, monkeypatch, env, chat, consolidation):
    from bot.llm import build_models

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    models = build_models(load_settings())
    try:
        main = models.chat.models[0]
        routed = models.consolidation.models[0]
        assert (main.provider, main.name) == chat
        assert (routed.provider, routed.name) == consolidation
        kinds = {"anthropic": "AnthropicChatModel", "openai": "OpenAIChatModel"}
        assert type(main).__name__ == kinds[chat[0]] and type(routed).__name__ == kinds[consolidation[0]]
    finally:
        await models.aclose()


async def test_fallback_chain_in_order(clean_env, monkeypatch):
    from bot.llm import build_models

    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ETHAN_FALLBACK_MODELS", "openai:gpt-4o-mini, anthropic:claude-haiku-4-5")
    models = build_models(load_settings())
    try:
        assert [(m.provider, m.name) for m in models.chat.models] == [
            ("anthropic", "claude-sonnet-4-6"), ("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")]
        assert len(models.clients) == 2          # one client per provider
    finally:
        await models.aclose()


# -- the provider and the model follow what is configured (issue 30, items 2, 3, 10) --------

def test_a_base_url_alone_picks_the_openai_provider_keyless(clean_env, monkeypatch):
    """Ollama / vLLM: OPENAI_BASE_URL and nothing else is a configured endpoint, not the
    offline model (it used to need ETHAN_PROVIDER=openai too)."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    s = load_settings()
    assert s.provider == "openai" and not s.offline_model
    assert s.provider_config("openai").api_key == ""


def test_the_default_model_follows_the_provider(clean_env, monkeypatch):
    assert load_settings().ethan_model == "claude-sonnet-4-6"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    s = load_settings()
    assert s.model_ref(s.ethan_model) == ("openai", "gpt-4o") and s.model_warnings() == []
    monkeypatch.setenv("ETHAN_MODEL", "")            # .env.example's empty line: the same
    assert load_settings().ethan_model == "gpt-4o"


def test_the_env_example_names_no_model_of_one_provider():
    import re

    values = dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", (ROOT / ".env.example").read_text(), re.M))
    assert values["ETHAN_MODEL"] == "", "cp .env.example .env + OPENAI_API_KEY must not send a Claude model to OpenAI"


def test_a_model_of_another_provider_is_warned_about(clean_env, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("ETHAN_MODEL", "claude-sonnet-4-6")
    (line,) = load_settings().model_warnings()
    assert "ETHAN_MODEL" in line and "claude-sonnet-4-6" in line and "\n" not in line
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    monkeypatch.setenv("ETHAN_FALLBACK_MODELS", "anthropic:gpt-4o-mini")
    (line,) = load_settings().model_warnings()
    assert "ETHAN_FALLBACK_MODELS" in line and "gpt-4o-mini" in line


@pytest.mark.parametrize("var,value", [
    ("ETHAN_DATABASE_URL", "mysql://x"),
    ("ETHAN_DATABASE_URL", "sqlite:///tmp/x.db"),
    ("ETHAN_LOG_LEVEL", "loud"),
    ("ETHAN_PROVIDER", "gemini"),
    ("LARK_TRANSPORT", "http"),
])
def test_unknown_schemes_and_enum_values_are_refused_in_one_line(clean_env, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert str(e.value).startswith(var) and "\n" not in str(e.value)
    assert not list(clean_env.rglob("*mysql*")) and not list(clean_env.rglob("*sqlite*"))


def test_log_level_and_transport_are_case_insensitive(clean_env, monkeypatch):
    monkeypatch.setenv("ETHAN_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("LARK_TRANSPORT", "WS")
    s = load_settings()
    assert (s.ethan_log_level, s.lark_transport) == ("warning", "ws")


@pytest.mark.parametrize("var,value", [
    ("ETHAN_LEASE_SECONDS", "0.01"),        # issue 32 M6: a second model call, replies out of order
    ("ETHAN_LEASE_SECONDS", "2.9"),
    ("ETHAN_SHUTDOWN_DEADLINE", "inf"),      # issue 32 Low: the force-exit timer died with OverflowError
    ("ETHAN_SHUTDOWN_DEADLINE", "nan"),
])
def test_serve_refuses_unsafe_lease_and_deadline_in_one_line(clean_env, var, value):
    env = {"PATH": "/usr/bin:/bin", "ETHAN_HOME": str(clean_env / "home"), var: value}
    r = subprocess.run([sys.executable, "-m", "bot", "serve"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert r.stderr.strip().count("\n") == 0 and var in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("env,provider,model", [
    ({}, "anthropic", "claude-sonnet-4-6"),
    ({"ANTHROPIC_API_KEY": "k"}, "anthropic", "claude-sonnet-4-6"),
    ({"OPENAI_API_KEY": "k"}, "openai", "gpt-4o"),
    ({"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}, "openai", "gpt-4o"),
    ({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}, "anthropic", "claude-sonnet-4-6"),
])
def test_the_readme_defaults_table_is_true_for_each_provider(clean_env, monkeypatch, env, provider, model):
    """(issue 52) The README said ETHAN_MODEL defaults to claude-sonnet-4-6 while with only
    OPENAI_API_KEY it is gpt-4o: the table's default cell names each provider's model."""
    import re

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    assert (s.provider, s.ethan_model) == (provider, model)
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `ETHAN_MODEL` |"))
    default = row.rstrip(" |").rsplit("|", 1)[1]
    assert re.search(rf"`{re.escape(model)}` on `{provider}`", default), default
