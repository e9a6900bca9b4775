"""Settings: the only place environment variables are read.

Sources, highest priority first: the environment, then `.env` in the working
directory, then `$ETHAN_HOME/config.yaml` (the spec's global config file; keys
are the same names, upper or lower case). A bad value stops start-up with one
line naming the variable (``ConfigError``), never a traceback.

The package: ``settings.py`` (``Settings``, ``load_settings``), ``sources.py`` (config.yaml, a
provider's key variable, ``ConfigError``), ``sections.py`` (config.yaml's ``providers:``,
``mcp_servers:``, ``tools:``), ``names.py`` (names with our prefixes that nothing reads:
the start-up warning). Its public face: ``Settings``, ``load_settings``, ``ConfigError``.
"""

from bot.infra.config.settings import Settings, load_settings  # noqa: F401
from bot.infra.config.sources import ConfigError  # noqa: F401
