"""Records of chat events: a chat greeted, a confirmation card answered, a /memory card sent, a
chat the bot left.

The once-only ones are decided by a unique key in one statement, so two deliveries (or two
processes) racing on the same event cannot both win. The chats the bot was removed from are
kept in the database so that a restart (or another replica) does not answer there again."""

from __future__ import annotations

import time
from dataclasses import dataclass

from storage import Database


async def first_greeting(db: Database, chat_id: str, kind: str) -> bool:
    """True the first time ``chat_id`` is greeted (ever: the row is kept)."""
    return await db.execute(
        "INSERT INTO chat_greetings(chat_id, kind, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (chat_id, kind, time.time())) > 0


# The confirm-card ledger: a card the bot sent is recorded (outcome 'asked', ``at`` = when it
# was sent, ``user_id`` = who was asked) right after Lark accepted it; a click acts only on a
# recorded card, by that user, within the TTL, once.
ASKED = "asked"


@dataclass(frozen=True, slots=True)
class ConfirmCard:
    card_message_id: str
    user_id: str          # who was asked (only their click acts)
    outcome: str          # asked | confirmed | cancelled | expired
    at: float             # when the card was sent


async def confirm_card_sent(db: Database, card_message_id: str, user_id: str, *, at: float | None = None) -> None:
    """The bot sent a confirm card asking ``user_id``: its buttons may act (once, in time)."""
    await db.execute(
        "INSERT INTO card_confirmations(card_message_id, user_id, outcome, at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING", (card_message_id, user_id, ASKED, time.time() if at is None else at))


async def confirm_card(db: Database, card_message_id: str) -> ConfirmCard | None:
    """The ledger's record of a confirm card; None: not a card the bot sent (or one sent before
    the ledger, or pruned)."""
    row = await db.fetchone(
        "SELECT card_message_id, user_id, outcome, at FROM card_confirmations WHERE card_message_id = ?",
        (card_message_id,))
    return None if row is None else ConfirmCard(row["card_message_id"], row["user_id"], row["outcome"], row["at"])


async def claim_card(db: Database, card_message_id: str, user_id: str, outcome: str, *,
                     sent_after: float) -> bool:
    """True for the first click that decides the card — by the user asked, on a card sent after
    ``sent_after`` (the TTL); later clicks (a second click, a redelivery under a new event id,
    another replica) find it decided. One conditional statement: atomic on both engines."""
    return await db.execute(
        "UPDATE card_confirmations SET outcome = ? WHERE card_message_id = ? AND user_id = ?"
        " AND outcome = ? AND at >= ?", (outcome, card_message_id, user_id, ASKED, sent_after)) > 0


# The /memory card is in the same ledger: its row's ``user_id`` is the card's owner and its
# ``outcome`` ``memory:<chat type>`` — never ``asked``, so no click can claim it as a confirm card.
# A click on a /memory card acts only on a card found here, by its owner, and redraws it with the
# chat type recorded here: never the button's value, which a forged click writes as it likes.
MEMORY_CARD = "memory:"


@dataclass(frozen=True, slots=True)
class MemoryCard:
    card_message_id: str
    owner: str            # whose memory it shows (only their click acts)
    chat_type: str        # where it was sent: p2p shows the private view, a group does not
    at: float


async def memory_card_sent(db: Database, card_message_id: str, owner: str, chat_type: str, *,
                           at: float | None = None) -> None:
    """The bot sent a /memory card showing ``owner``'s memory in a ``chat_type`` chat."""
    await db.execute(
        "INSERT INTO card_confirmations(card_message_id, user_id, outcome, at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (card_message_id, owner, MEMORY_CARD + chat_type, time.time() if at is None else at))


async def memory_card(db: Database, card_message_id: str) -> MemoryCard | None:
    """The ledger's record of a /memory card; None: not one the bot sent (or a confirm card)."""
    card = await confirm_card(db, card_message_id)
    if card is None or not card.outcome.startswith(MEMORY_CARD):
        return None
    return MemoryCard(card.card_message_id, card.user_id, card.outcome.removeprefix(MEMORY_CARD), card.at)


async def chat_left(db: Database, chat_id: str) -> None:
    """The bot was removed from ``chat_id``: messages still queued for it are not answered."""
    await db.execute("INSERT INTO chats_left(chat_id, at) VALUES (?, ?)"
                     " ON CONFLICT(chat_id) DO UPDATE SET at = excluded.at", (chat_id, time.time()))


async def chat_rejoined(db: Database, chat_id: str) -> None:
    await db.execute("DELETE FROM chats_left WHERE chat_id = ?", (chat_id,))


async def chats_left(db: Database) -> set[str]:
    return {r["chat_id"] for r in await db.fetchall("SELECT chat_id FROM chats_left")}


async def has_left(db: Database, chat_id: str) -> bool:
    """Whether the bot was removed from ``chat_id`` (and not added back)."""
    return await db.fetchone("SELECT 1 FROM chats_left WHERE chat_id = ?", (chat_id,)) is not None


async def conversation_of_message(db: Database, lark_message_id: str) -> str | None:
    """The conversation key of the session that holds the user message ``lark_message_id``
    (None if no session does)."""
    row = await db.fetchone(
        "SELECT s.conv_key FROM messages m JOIN sessions s ON s.id = m.session_id"
        " WHERE m.lark_message_id = ? AND m.role = 'user' LIMIT 1", (lark_message_id,))
    return None if row is None else row["conv_key"]
