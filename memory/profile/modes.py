"""Per user, per conversation: work assistant (default) or companion listening mode (陪伴)."""

from __future__ import annotations

import time

from storage import Database
from memory.queries import Query, run

WORK = "work"
COMPANION = "companion"
ALIASES = {
    "work": WORK, "工作": WORK, "助手": WORK, "assistant": WORK,
    "companion": COMPANION, "陪伴": COMPANION, "listen": COMPANION, "苏念": COMPANION,
}


def parse_mode(text: str) -> str | None:
    return ALIASES.get(text.strip().casefold())


class ModeStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, user_id: str, conv_key: str) -> str:
        return await run(self.db, self.get_query(user_id, conv_key))

    def get_query(self, user_id: str, conv_key: str) -> Query[str]:
        return Query((("SELECT mode FROM modes WHERE user_id = ? AND conv_key = ?", (user_id, conv_key)),),
                     lambda rows: rows[0][0]["mode"] if rows[0] else WORK)

    async def set(self, user_id: str, conv_key: str, mode: str) -> None:
        if mode not in (WORK, COMPANION):
            raise ValueError(f"unknown mode {mode!r}")
        await self.db.execute(
            "INSERT INTO modes(user_id, conv_key, mode, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(user_id, conv_key) DO UPDATE SET mode = excluded.mode, updated_at = excluded.updated_at",
            (user_id, conv_key, mode, time.time()),
        )

    async def delete_user(self, user_id: str) -> None:
        await self.db.execute("DELETE FROM modes WHERE user_id = ?", (user_id,))
