"""The start-up check of the main model: one clear line naming the setting to fix."""

from __future__ import annotations

import re
from typing import Any

from bot.llm.policy import DNS_FAILED, NO_ROUTES, REFUSED, log
from bot.infra.log import safe_url
from memory.llm import ModelFailure


def problem_setting(line: str) -> str:
    """The setting a problem line names first (``OPENAI_API_KEY: rejected by …`` -> OPENAI_API_KEY)."""
    m = re.match(r"[A-Za-z][\w.]*", line or "")
    return m.group(0) if m else ""


def problem_line(settings: Any, model: Any, kind: str, detail: str = "", model_setting: str = "ETHAN_MODEL") -> str:
    """What is wrong, naming the setting: ``OPENAI_API_KEY: rejected by …`` and the like."""
    p = settings.provider_config(model.provider)
    # the URL may carry credentials (user:pass@, ?api-key=): this line reaches /healthz
    where = safe_url(p.base_url) if p.base_url else (
        "https://api.anthropic.com" if p.kind == "anthropic" else "https://api.openai.com/v1")
    if kind == "auth":
        if not p.api_key:       # nothing was sent: "rejected" would send the operator to the wrong key
            return (f"{p.key_setting or 'the API key'}: not set; {where} (provider {p.name}) "
                    f"asks for a key")
        return f"{p.key_setting or 'the API key'}: rejected by {where} (provider {p.name}); check the key"
    if kind == "not_found" and detail.startswith(NO_ROUTES):
        versioned = re.search(r"/v\d+[a-z]*$", where)
        hint = ("add /v1?" if p.kind == "openai" and not versioned
                else "remove /v1? (the Anthropic SDK adds it)" if p.kind == "anthropic" and versioned
                else "check the base URL")
        return (f"{p.url_setting}: {where} has no model routes (they answer 404; "
                f"provider {p.name}); {hint}")
    if kind == "not_found":
        return (f"{model_setting}: model {model.name!r} is not known at {where} (provider {p.name}); "
                f"check the model name")
    if kind in ("connection", "timeout"):
        # which failure, in words: a misspelt host, a closed port and a silent one are three fixes
        how = (DNS_FAILED if detail.startswith(DNS_FAILED) else REFUSED if detail.startswith(REFUSED)
               else kind)
        detail = detail.removeprefix(how + ": ")
        return (f"{p.url_setting}: cannot reach {where} "
                f"(provider {p.name}, {how}){': ' + safe_url(detail[:120]) if detail else ''}")
    if kind == "spend_limit":
        return f"{p.key_setting}: the usage limit of provider {p.name} is reached"
    return f"{model_setting}: provider {p.name} at {where} answered the check with {kind}"


async def check_models(settings: Any, models: Any) -> str:
    """The first problem of the configured models — the main one, each fallback, the
    consolidation model — each model checked once; "" when all are usable."""
    chain = list(models.chat.models)
    named = [("ETHAN_MODEL", chain[0])] + [("ETHAN_FALLBACK_MODELS", m) for m in chain[1:]]
    named += [("ETHAN_CONSOLIDATION_MODEL" if settings.ethan_consolidation_model else "ETHAN_MODEL",
               m) for m in models.consolidation.models]
    seen: set[tuple[str, str]] = set()
    problems = []
    for setting, model in named:
        key = (model.provider, model.name)
        if key in seen:
            continue
        seen.add(key)
        problem = await check_model(settings, model, setting)
        if problem:
            problems.append(problem if setting == "ETHAN_MODEL" else f"{setting} {model.provider}:{model.name}: {problem}")
    return problems[0] if problems else ""


async def check_model(settings: Any, model: Any, model_setting: str = "ETHAN_MODEL") -> str:
    """"" when the main model is usable, else the line. Transient answers (overloaded,
    rate-limited, a 5xx) are not a configuration problem: logged, not reported."""
    check = getattr(model, "check", None)
    if check is None:
        return ""
    try:
        await check()
    except ModelFailure as f:
        if f.kind in ("auth", "not_found", "connection", "timeout", "spend_limit"):
            return problem_line(settings, model, f.kind, f.detail, model_setting)
        log.warning("model.check_inconclusive", model=model.name, provider=model.provider, kind=f.kind,
                    status=f.status)
    except Exception as e:  # noqa: BLE001 — a check never stops the start
        log.warning("model.check_inconclusive", model=model.name, provider=model.provider, error=repr(e)[:200])
    return ""
