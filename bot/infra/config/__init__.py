"""Settings: the only place environment variables are read. Its public face: ``Settings``,
``load_settings`` and ``ConfigError``."""

from bot.infra.config.settings import ConfigError, Settings, load_settings  # noqa: F401
