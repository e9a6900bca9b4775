"""Once-only records for chat events: a chat greeted, a confirmation card answered.

Both are decided by a unique key in one statement, so two deliveries (or two processes)
racing on the same event cannot both win."""

from __future__ import annotations

import time

from memory.db import Database


async def first_greeting(db: Database, chat_id: str, kind: str) -> bool:
    """True the first time ``chat_id`` is greeted (ever: the row is kept)."""
    return await db.execute(
        "INSERT INTO chat_greetings(chat_id, kind, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (chat_id, kind, time.time())) > 0


async def claim_card(db: Database, card_message_id: str, user_id: str, outcome: str) -> bool:
    """True for the first click that decides the card; later clicks (a second click, a
    redelivery under a new event id) find it decided."""
    return await db.execute(
        "INSERT INTO card_confirmations(card_message_id, user_id, outcome, at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING", (card_message_id, user_id, outcome, time.time())) > 0
