"""Where settings come from besides the environment's own variables: config.yaml, a key variable, and the one-line error.

``_YamlSource`` reads ``$ETHAN_HOME/config.yaml`` (its home itself from the environment or
``.env``), ``_read_var`` a provider's key variable (``api_key_env``: the environment, then
``.env``), and ``ConfigError`` is the one clear line a bad setting stops start-up with. Apart
from ``Settings`` (settings.py), which lists these sources in their order of priority.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import InitSettingsSource

class ConfigError(ValueError):
    """One clear line about a bad setting."""


def _read_var(name: str) -> str:
    """A provider's key variable: the environment, then ./.env (as for every setting)."""
    if os.environ.get(name):
        return os.environ[name]
    try:
        from dotenv import dotenv_values

        return str(dotenv_values(".env").get(name) or "") if Path(".env").is_file() else ""
    except Exception:  # noqa: BLE001 — an unreadable .env is reported by the settings themselves
        return ""



class _YamlSource(InitSettingsSource):
    """$ETHAN_HOME/config.yaml, where ETHAN_HOME itself comes from env/.env/default."""

    def __init__(self, settings_cls, env_settings, dotenv_settings) -> None:
        home = None
        for src in (env_settings, dotenv_settings):
            try:
                home = src().get("ethan_home") or home
            except Exception:
                pass
            if home:
                break
        home = Path(os.path.expanduser(str(home))) if home else Path.home() / ".ethan"
        data: dict[str, Any] = {}
        path = home / "config.yaml"
        if path.is_file():
            try:
                loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: not valid YAML ({e.__class__.__name__})") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: expected a mapping of SETTING: value")
            data = {str(k).lower(): v for k, v in loaded.items()}
        super().__init__(settings_cls, data)
