"""Misspelt setting names: an environment (or ``.env``) name with one of our prefixes that no
setting, SDK or tool reads gets one start-up warning naming the closest known setting.

Pydantic ignores unknown names (``extra="ignore"``): ``ETHAN_MODLE=gpt-4o`` or
``OPENAI_BASEURL=…`` used to be dropped in silence and the default used (issue 52).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Iterable

PREFIXES = ("ETHAN_", "LARK_", "OPENAI_", "ANTHROPIC_")

# Read by someone else, so never "unknown": the openai and anthropic SDKs' own variables (as
# found in their sources: os.environ.get("OPENAI_…") / ("ANTHROPIC_…")), and the variables of
# this repository's tooling that an app started by it inherits (tests/, Makefile, CI).
NOT_OURS = frozenset({
    # openai SDK (incl. its Azure client)
    "OPENAI_ADMIN_KEY", "OPENAI_API_TYPE", "OPENAI_API_VERSION", "OPENAI_CUSTOM_HEADERS",
    "OPENAI_LOG", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "OPENAI_WEBHOOK_SECRET",
    # anthropic SDK (incl. Bedrock, Vertex, Foundry, telemetry)
    "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BEDROCK_BASE_URL", "ANTHROPIC_BEDROCK_MANTLE_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_ENVIRONMENT_KEY", "ANTHROPIC_FOUNDRY_API_KEY",
    "ANTHROPIC_FOUNDRY_BASE_URL", "ANTHROPIC_FOUNDRY_RESOURCE", "ANTHROPIC_GOOGLE_CLOUD_BASE_URL",
    "ANTHROPIC_GOOGLE_CLOUD_LOCATION", "ANTHROPIC_GOOGLE_CLOUD_PROJECT",
    "ANTHROPIC_GOOGLE_CLOUD_WORKSPACE_ID", "ANTHROPIC_LOG", "ANTHROPIC_OPEN_TELEMETRY",
    "ANTHROPIC_OPEN_TELEMETRY_PROPAGATION", "ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE",
    "ANTHROPIC_OPEN_TELEMETRY_TRACES_MAX_CONTENT_BYTES", "ANTHROPIC_VERTEX_BASE_URL",
    "ANTHROPIC_VERTEX_PROJECT_ID", "ANTHROPIC_WEBHOOK_SIGNING_KEY", "ANTHROPIC_WORK_SECRET",
    # ours, but not settings: an MCP child's parent pid (bot/tools/mcp_child.py); the tests'
    # and CI's own switches (tests/conftest.py, tests/preflight.py, Makefile)
    "ETHAN_MCP_PARENT", "ETHAN_CHROMIUM", "ETHAN_CI_IN_CLONE", "ETHAN_FAKETIME", "ETHAN_FIXTURES", "ETHAN_PG_BINDIR",
})

_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def known_names(settings: Any) -> set[str]:
    """Every name something reads: the settings, the providers' key variables, the
    ``${VAR}``s config.yaml's MCP servers name, and NOT_OURS."""
    names = {n.upper() for n in type(settings).model_fields} | NOT_OURS
    names |= {p.api_key_env.upper() for p in settings.providers.values() if p.api_key_env}
    names |= {m.upper() for m in _REF.findall(repr(settings.mcp_servers))}
    return names


def unknown_names(settings: Any, env: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(name, closest known setting or "") for each name with one of PREFIXES that nothing
    reads, from the environment and ./.env (``env``: the names to look at instead)."""
    if env is None:
        env = [*os.environ, *_dotenv_names()]
    known = known_names(settings)
    settings_names = sorted(n for n in known if n not in NOT_OURS)
    out: dict[str, str] = {}
    for raw in env:
        name = raw.upper()
        if not name.startswith(PREFIXES) or name in known or name in out:
            continue
        close = difflib.get_close_matches(name, settings_names, n=1, cutoff=0.6)
        out[name] = close[0] if close else ""
    return sorted(out.items())


def _dotenv_names() -> list[str]:
    if not Path(".env").is_file():
        return []
    try:
        from dotenv import dotenv_values

        return list(dotenv_values(".env"))
    except Exception:  # noqa: BLE001 — an unreadable .env is reported by the settings themselves
        return []
