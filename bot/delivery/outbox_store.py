"""The outbox: what the bot sent, keyed by the uuid Lark dedups on.

Today it records card replies: the CardKit entity behind a card message is created before the
message is sent, and a new entity on every run would leave a half-written card on screen plus a
second card after a crash (docs/reliability.md, D1). The row is written right after the entity
is created, so a reply processed again finds the card the user already sees and finishes it.
"""

from __future__ import annotations

import time
from typing import Protocol

from storage import Database

KEEP_SECONDS = 2 * 24 * 3600   # Lark's uuid dedup lasts an hour; a crashed reply is answered within 30 min


class CardLedger(Protocol):
    async def card_for(self, uuid: str) -> str | None:
        """The card entity already created for this card-message uuid, if any."""

    async def card_created(self, uuid: str, *, chat_id: str, reply_to: str, card_id: str) -> None:
        """Record the entity before the message showing it is sent."""

    async def sent(self, uuid: str, lark_message_id: str) -> None:
        """The message showing the card was delivered."""


class Outbox:
    def __init__(self, db: Database, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock

    async def card_for(self, uuid: str) -> str | None:
        row = await self.db.fetchone(
            "SELECT card_id FROM outbox WHERE uuid = ? AND kind = 'card' AND card_id IS NOT NULL", (uuid,))
        return row["card_id"] if row else None

    async def card_created(self, uuid: str, *, chat_id: str, reply_to: str, card_id: str) -> None:
        await self.db.execute(
            "INSERT INTO outbox(uuid, chat_id, reply_to, kind, status, created_at, card_id)"
            " VALUES (?,?,?,'card','pending',?,?)"
            " ON CONFLICT(uuid) DO UPDATE SET card_id = excluded.card_id",
            (uuid, chat_id, reply_to, self.clock(), card_id),
        )

    async def sent(self, uuid: str, lark_message_id: str) -> None:
        await self.db.execute(
            "UPDATE outbox SET status = 'sent', lark_message_id = ?, sent_at = ? WHERE uuid = ?",
            (lark_message_id, self.clock(), uuid),
        )

    async def text_sent(self, uuid: str, *, chat_id: str, reply_to: str, lark_message_id: str) -> None:
        """A text reply as delivered, so a recall of the message it answered can find it
        (written only with ETHAN_RECALL_REPLIES: otherwise nothing reads it)."""
        await self.db.execute(
            "INSERT INTO outbox(uuid, chat_id, reply_to, lark_message_id, kind, status, created_at, sent_at)"
            " VALUES (?,?,?,?,'text','sent',?,?) ON CONFLICT(uuid) DO NOTHING",
            (uuid, chat_id, reply_to, lark_message_id, self.clock(), self.clock()))

    async def prune(self, *, keep: float = KEEP_SECONDS) -> int:
        return await self.db.execute("DELETE FROM outbox WHERE created_at < ?", (self.clock() - keep,))
