"""Each user's time zone: Lark's contact API where it gives one (``time_zone``), else the
profile (an IANA name written there, e.g. "时区: Europe/Berlin"), else ``ETHAN_TIMEZONE``.

"明天九点" means nine o'clock where the user is. A lookup is cached per user for a day; a
failed lookup (no contact scope, user left) falls through to the next source, never fails."""

from __future__ import annotations

import re
import time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.infra.log import get_logger

log = get_logger("ethan.timezones")
_IANA = re.compile(r"\b((?:Africa|America|Antarctica|Asia|Atlantic|Australia|Europe|Indian|Pacific)"
                   r"/[A-Za-z_]+(?:/[A-Za-z_]+)?|UTC)\b")


def valid_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
        return True
    except (ZoneInfoNotFoundError, ValueError):
        return False


def zone_in_text(text: str) -> str:
    """The first valid IANA zone named in ``text`` (a profile), or ""."""
    for m in _IANA.finditer(text or ""):
        if valid_zone(m.group(1)):
            return m.group(1)
    return ""


class UserZones:
    def __init__(self, api, profile, default: str, *, ttl: float = 24 * 3600) -> None:
        self.api = api              # bot.lark.openapi.client.OpenApi, or None (console only)
        self.profile = profile      # memory.profile.store.ProfileStore, or None
        self.default = default
        self.ttl = ttl
        self._cache: dict[str, tuple[str, float]] = {}

    async def zone_of(self, open_id: str) -> str:
        hit = self._cache.get(open_id)
        if hit and hit[1] > time.monotonic():
            return hit[0]
        zone = await self._from_lark(open_id) or await self._from_profile(open_id) or self.default
        self._cache[open_id] = (zone, time.monotonic() + self.ttl)
        return zone

    async def _from_lark(self, open_id: str) -> str:
        if self.api is None or not open_id.startswith("ou_"):
            return ""
        try:
            data = await self.api.request("GET", f"/open-apis/contact/v3/users/{open_id}",
                                          params={"user_id_type": "open_id"})
            zone = str((data.get("user") or {}).get("time_zone") or "")
            return zone if zone and valid_zone(zone) else ""
        except Exception as e:  # noqa: BLE001 — a zone is never worth failing a request
            log.info("timezone.lookup_failed", open_id=open_id, error=str(e)[:200])
            return ""

    async def _from_profile(self, open_id: str) -> str:
        if self.profile is None:
            return ""
        try:
            text = await self.profile.read_document(open_id)
        except Exception as e:  # noqa: BLE001
            log.info("timezone.profile_failed", open_id=open_id, error=str(e)[:200])
            return ""
        return zone_in_text(text if isinstance(text, str) else "")
