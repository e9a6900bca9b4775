"""config.yaml's structured settings: ``providers:``, ``mcp_servers:``, ``tools:``, and a provider resolved.

``ProviderConfig`` (one named model provider), ``McpServerConfig`` (one MCP server: stdio or
streamable HTTP, its read-only tools and size limits), ``ToolsConfig`` (the tool policy) and
``ResolvedProvider`` (a provider's kind, URL and key, wherever they came from). Mappings with
no environment variable of their own (README "Tools and MCP servers"): apart from ``Settings``
(settings.py), whose fields they are, so that the flat variables read on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

class ProviderConfig(BaseModel):
    """One entry of config.yaml's ``providers:``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["anthropic", "openai"]
    base_url: str = ""
    api_key_env: str = ""     # the variable holding its key (keys stay out of config files)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v


class McpServerConfig(BaseModel):
    """One entry of config.yaml's ``mcp_servers:`` (README "Tools and MCP servers")."""

    model_config = ConfigDict(extra="forbid")
    command: str = ""                 # stdio: the program, its args and extra env
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)      # values may say ${VAR}
    cwd: str = ""
    url: str = ""                     # streamable HTTP: the endpoint (…/mcp) and headers
    headers: dict[str, str] = Field(default_factory=dict)  # values may say ${VAR}
    timeout: float = Field(default=30.0, gt=0, le=600)     # per call and for start-up
    # Read-only tools (offered in groups, never confirmed) are the operator's word only: a
    # server's readOnlyHint is an untrusted hint (issue 45, N4). true: every tool of the server;
    # false: none; unset: those named in read_only_tools (the server's own tool names).
    read_only: bool | None = None
    read_only_tools: list[str] = Field(default_factory=list)
    # Its tool list rides on every request: more tools or bytes of definitions (name,
    # description, schema as JSON) than this and none of its tools are offered (N5).
    max_tools: int = Field(default=64, ge=1, le=10_000)
    max_tool_bytes: int = Field(default=131_072, ge=1_024, le=16_777_216)

    @field_validator("env", "headers", mode="before")
    @classmethod
    def _strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): str(x) for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerConfig":
        if bool(self.command) == bool(self.url):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


class ToolsConfig(BaseModel):
    """config.yaml ``tools:`` — the tool policy (docs/operations.md "Tools")."""

    model_config = ConfigDict(extra="forbid")
    # Side-effecting tools in groups: off by default (p2p only); on, each call waits for the
    # asker's click on a confirm card.
    side_effects_in_groups: bool = False
    chat_types: dict[str, list[Literal["p2p", "group"]]] = Field(default_factory=dict)  # provider/tool -> where
    admins_only: list[str] = Field(default_factory=list)    # tool or provider names
    disabled: list[str] = Field(default_factory=list)       # tool or provider names
    lark_docs: bool = True            # the built-in Feishu documents reader
    max_result_chars: int = Field(default=16_000, ge=500, le=200_000)
    # All MCP servers' tools together (each server also has its own max_tools/max_tool_bytes).
    mcp_max_tools: int = Field(default=128, ge=1, le=10_000)
    mcp_max_bytes: int = Field(default=262_144, ge=1_024, le=67_108_864)

    def budget(self):
        from bot.tools.mcp import ToolBudget
        return ToolBudget(max_tools=self.mcp_max_tools, max_bytes=self.mcp_max_bytes)

    def policy(self):
        from bot.tools.registry import ToolPolicy
        return ToolPolicy(side_effects_in_groups=self.side_effects_in_groups,
                          chat_types={k: tuple(v) for k, v in self.chat_types.items()},
                          admins_only=frozenset(self.admins_only), disabled=frozenset(self.disabled))


@dataclass(frozen=True, slots=True)
class ResolvedProvider:
    name: str
    kind: str
    base_url: str
    api_key: str
    key_setting: str      # where the key comes from, for messages naming the setting
    url_setting: str
