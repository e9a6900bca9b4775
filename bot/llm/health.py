"""The start-up check of the main model: one clear line naming the setting to fix."""

from __future__ import annotations

from typing import Any

from bot.llm.policy import log
from memory.llm import ModelFailure


def problem_line(settings: Any, model: Any, kind: str, detail: str = "") -> str:
    """What is wrong, naming the setting: ``OPENAI_API_KEY: rejected by …`` and the like."""
    p = settings.provider_config(model.provider)
    where = p.base_url or ("https://api.anthropic.com" if p.kind == "anthropic" else "https://api.openai.com/v1")
    model_setting = "ETHAN_MODEL"
    if kind == "auth":
        return f"{p.key_setting or 'the API key'}: rejected by {where} (provider {p.name}); check the key"
    if kind == "not_found":
        return (f"{model_setting}: model {model.name!r} is not known at {where} (provider {p.name}); "
                f"check the model name")
    if kind in ("connection", "timeout"):
        return (f"{p.url_setting}: cannot reach {where} "
                f"(provider {p.name}, {kind}){': ' + detail[:120] if detail else ''}")
    if kind == "spend_limit":
        return f"{p.key_setting}: the usage limit of provider {p.name} is reached"
    return f"{model_setting}: provider {p.name} at {where} answered the check with {kind}"


async def check_model(settings: Any, model: Any) -> str:
    """"" when the main model is usable, else the line. Transient answers (overloaded,
    rate-limited, a 5xx) are not a configuration problem: logged, not reported."""
    check = getattr(model, "check", None)
    if check is None:
        return ""
    try:
        await check()
    except ModelFailure as f:
        if f.kind in ("auth", "not_found", "connection", "timeout", "spend_limit"):
            return problem_line(settings, model, f.kind, f.detail)
        log.warning("model.check_inconclusive", model=model.name, provider=model.provider, kind=f.kind,
                    status=f.status)
    except Exception as e:  # noqa: BLE001 — a check never stops the start
        log.warning("model.check_inconclusive", model=model.name, provider=model.provider, error=repr(e)[:200])
    return ""
