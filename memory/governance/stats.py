"""Counts across every user, for operators: /stats (admins) and the console's user list.

These are the only reads in memory/ that span users on purpose — the admin views of "how much
is stored, about whom". Each is one unit of work (one round trip on SQLite, one snapshot on
PostgreSQL), written once for both dialects. Anything about one user goes through that user's
store instead (facts, profile, episodes, …), filtered by the user in SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage import Database

USERS_LISTED = 1000


@dataclass(frozen=True, slots=True)
class Totals:
    users: int
    conversations: int
    sessions: int
    messages: int
    facts: int           # current facts (superseded ones are history)
    episodes: int


@dataclass(frozen=True, slots=True)
class KnownUser:
    """Someone the bot knows of, with how much is stored about them."""
    id: str
    name: str            # the latest display name they sent a message under ('' if none)
    last_seen: float     # their latest message or memory write
    facts: int
    procedures: int
    profile_entries: int
    episodes: int
    messages: int


# A derived table needs an alias on PostgreSQL before 16 (SQLite does not care): every
# subquery in FROM below is named.
_TOTALS = (
    "SELECT"
    " (SELECT COUNT(*) FROM (SELECT user_id FROM conversation_members UNION SELECT user_id FROM facts"
    "   UNION SELECT user_id FROM profile_entries UNION SELECT user_id FROM episodes) AS known) AS users,"
    " (SELECT COUNT(*) FROM conversations) AS conversations,"
    " (SELECT COUNT(*) FROM sessions) AS sessions,"
    " (SELECT COUNT(*) FROM messages) AS messages,"
    " (SELECT COUNT(*) FROM facts WHERE superseded_at IS NULL) AS facts,"
    " (SELECT COUNT(*) FROM episodes) AS episodes"
)

_USERS = (
    "SELECT u.user_id AS user_id, MAX(u.last) AS last_seen,"
    " (SELECT m.sender_name FROM messages m WHERE m.sender_id = u.user_id AND m.sender_name <> ''"
    "  ORDER BY m.id DESC LIMIT 1) AS name"
    " FROM ("
    "  SELECT sender_id AS user_id, MAX(created_at) AS last FROM messages"
    "   WHERE role = 'user' AND sender_id <> '' GROUP BY sender_id"
    "  UNION ALL SELECT user_id, MAX(updated_at) FROM facts GROUP BY user_id"
    "  UNION ALL SELECT user_id, MAX(updated_at) FROM profile_entries GROUP BY user_id"
    "  UNION ALL SELECT scope_id, MAX(created_at) FROM procedures WHERE scope = 'user' GROUP BY scope_id"
    "  UNION ALL SELECT user_id, MAX(timestamp) FROM episodes GROUP BY user_id"
    " ) AS u WHERE u.user_id <> '' GROUP BY u.user_id ORDER BY last_seen DESC, u.user_id LIMIT ?"
)

_PER_USER = (
    ("facts", "SELECT user_id AS u, COUNT(*) AS n FROM facts WHERE superseded_at IS NULL GROUP BY user_id"),
    ("procedures", "SELECT scope_id AS u, COUNT(*) AS n FROM procedures WHERE scope = 'user' GROUP BY scope_id"),
    ("profile_entries", "SELECT user_id AS u, COUNT(*) AS n FROM profile_entries GROUP BY user_id"),
    ("episodes", "SELECT user_id AS u, COUNT(*) AS n FROM episodes GROUP BY user_id"),
    ("messages", "SELECT sender_id AS u, COUNT(*) AS n FROM messages WHERE role = 'user' GROUP BY sender_id"),
)


# One user's row of the list above, every part filtered by the user in SQL.
_ONE_USER = (
    "SELECT"
    " (SELECT MAX(t) FROM ("
    "   SELECT MAX(created_at) AS t FROM messages WHERE sender_id = ? AND role = 'user'"
    "   UNION ALL SELECT MAX(updated_at) FROM facts WHERE user_id = ?"
    "   UNION ALL SELECT MAX(updated_at) FROM profile_entries WHERE user_id = ?"
    "   UNION ALL SELECT MAX(created_at) FROM procedures WHERE scope = 'user' AND scope_id = ?"
    "   UNION ALL SELECT MAX(timestamp) FROM episodes WHERE user_id = ?) AS seen) AS last_seen,"
    " (SELECT sender_name FROM messages WHERE sender_id = ? AND sender_name <> ''"
    "   ORDER BY id DESC LIMIT 1) AS name,"
    " (SELECT COUNT(*) FROM facts WHERE user_id = ? AND superseded_at IS NULL) AS facts,"
    " (SELECT COUNT(*) FROM procedures WHERE scope = 'user' AND scope_id = ?) AS procedures,"
    " (SELECT COUNT(*) FROM profile_entries WHERE user_id = ?) AS profile_entries,"
    " (SELECT COUNT(*) FROM episodes WHERE user_id = ?) AS episodes,"
    " (SELECT COUNT(*) FROM messages WHERE sender_id = ? AND role = 'user') AS messages"
)


def _totals_sync(conn: Any) -> Totals:
    r = conn.execute(_TOTALS).fetchone()
    return Totals(*(int(r[i] or 0) for i in range(6)))


def _users_sync(conn: Any, limit: int) -> list[KnownUser]:
    rows = conn.execute(_USERS, (limit,)).fetchall()
    counts: dict[str, dict[str, int]] = {}
    for key, sql in _PER_USER:
        for r in conn.execute(sql).fetchall():
            counts.setdefault(r["u"], {})[key] = int(r["n"])
    out = []
    for r in rows:
        c = counts.get(r["user_id"], {})
        out.append(KnownUser(id=r["user_id"], name=r["name"] or "", last_seen=float(r["last_seen"]),
                             **{key: c.get(key, 0) for key, _ in _PER_USER}))
    return out


def _one_user_sync(conn: Any, user_id: str) -> KnownUser | None:
    r = conn.execute(_ONE_USER, (user_id,) * _ONE_USER.count("?")).fetchone()
    if r is None or r["last_seen"] is None:
        return None
    return KnownUser(id=user_id, name=r["name"] or "", last_seen=float(r["last_seen"]),
                     **{key: int(r[key] or 0) for key, _ in _PER_USER})


class Stats:
    """Operator-wide counts over one Database (either backend)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def totals(self) -> Totals:
        """What /stats reports about storage, from one snapshot."""
        return await self.db.read(_totals_sync)

    async def known_users(self, limit: int = USERS_LISTED) -> list[KnownUser]:
        """Everyone the bot knows of (from messages, facts, profile, rules and episodes), most
        recently seen first, each with their stored counts — from one snapshot."""
        return await self.db.read(_users_sync, max(0, int(limit)))

    async def known_user(self, user_id: str) -> KnownUser | None:
        """One user's entry of ``known_users`` (None if nothing is stored about them)."""
        if not user_id:
            return None
        return await self.db.read(_one_user_sync, user_id)
