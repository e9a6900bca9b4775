"""Clicks on the /memory card (Lark: bot/lark/outbound/memory_card.py): Forget, Correct, Save, Back —
decided here, for any transport that shows the card (the adapter translates the click into
``bot.core.lifecycle.ButtonClicked`` with ``button == "memory"`` and draws the card).

A click is a row in the inbox like any event and runs in its chat's mailbox, in order with the
chat's messages. Who owns the card, and which view it shows (a direct chat's private one, or a
group's), come from the card ledger (memory/sessions/chat_events.py ``memory_card``: recorded when Lark
accepted the card), never from the button's value, which a forged click writes as it likes. Only
the owner acts: another user's click, a click on a card the ledger does not know, and a value
that disagrees with the ledger change nothing — logged, audited. The owner's click runs the
typed command the button stands for, *as the clicker* (``/forget 12``, ``/correct 12 …``), then
the card is redrawn from a fresh /memory (what Ethan knows now) with the outcome on top; Correct
redraws it as the item's edit form. The card is not claimed once like a confirm card: it governs
many items, and a redelivered click is the same event (deduplicated at intake).
"""

from __future__ import annotations

from typing import Any

from bot.commands.memory import MemoryView, correct_command, forget_command
from bot.core.inbound import Inbound
from memory.governance import audit
from memory.sessions import chat_events

MEMORY = "memory"                  # ButtonClicked.button of the /memory card's buttons
REFUSED = "click by another user"
NOT_OURS = "not a /memory card Ethan sent"
DISAGREES = "button value disagrees with the card"
REFUSALS = frozenset({REFUSED, NOT_OURS, DISAGREES})


def verdict(card: chat_events.MemoryCard | None, clicker: str, value_owner: str, value_chat_type: str) -> str:
    """"" when the click may act; otherwise why not (one of ``REFUSALS``). ``card``: the ledger's
    record; ``value_*``: what the button's value claims (it must agree, or the value was forged)."""
    if card is None:
        return NOT_OURS
    if not clicker or clicker != card.owner:
        return REFUSED
    if value_owner != card.owner or value_chat_type != card.chat_type:
        return DISAGREES
    return ""


async def refuse(db: Any, bound: Any, *, clicker: str, owner: str, item: str, chat_id: str,
                 reason: str = REFUSED) -> None:
    """A click that changes nothing: one log line and an audit row, nothing else (the intake,
    which answers it with a toast, and the mailbox's own check share it). ``owner``: the
    ledger's, "" for a card it does not know."""
    bound.info("card.refused", reason=reason, owner=owner[-6:])
    await audit.record(db, clicker, "card.memory", target=item[:60], chat_id=chat_id,
                       detail=reason, allowed=False)


async def memory_clicked(d: Any, item: Any, ev: Any, bound: Any) -> str:
    """Handle one click (``d``: bot.core.lifecycle.LifecycleDeps); returns the inbox row's note."""
    bound = bound.bind(user_id=ev.clicker, card_message_id=ev.card_message_id, op=ev.op[:16])
    # Decided at intake too (bot/lark/card_clicks.py); checked again here from the ledger for a
    # row intake did not decide (stored by an older version, or another replica's).
    card = await chat_events.memory_card(d.db, ev.card_message_id)
    why = verdict(card, ev.clicker, ev.asked_by, ev.chat_type)
    if why:
        await refuse(d.db, bound, clicker=ev.clicker, owner=card.owner if card else "",
                     item=f"{ev.item_kind} {ev.item_id}", chat_id=ev.chat_id, reason=why)
        return why
    chat_type = card.chat_type

    def inbound(text: str) -> Inbound:
        # the owner, in the card's chat: the command sees what /memory there sees
        return Inbound(transport=d.transport, message_id=ev.card_message_id, chat_id=ev.chat_id,
                       chat_type=chat_type, sender_id=ev.clicker, text=text, event_id=item.event_id)

    async def view() -> MemoryView | None:
        v = await d.run_command(inbound("/memory"), "/memory")
        return v if isinstance(v, MemoryView) else None

    current = await view()
    if current is None:
        return "memory view unavailable"
    target = next((it for it in current.items if it.kind == ev.item_kind and it.id == ev.item_id), None)
    notice = ""
    if ev.op in ("forget", "save", "correct") and target is None:
        notice = "这一条已经不在了。 / That item is gone already." if current.zh else "That item is gone already."
    elif ev.op == "forget":
        notice = await d.run_command(inbound(forget_command(target)), forget_command(target)) or ""
        current = await view() or current
    elif ev.op == "correct":
        if d.actions is not None:
            await d.actions.show_memory_card(ev.card_message_id, current, chat_type=chat_type, editing=target)
        bound.info("card.memory", outcome="editing", kind=target.kind, item_id=target.id)
        return "editing"
    elif ev.op == "save":
        text = " ".join(ev.text.split())
        if not text:
            notice = "没有输入新的内容，什么都没改。 / Nothing typed; nothing changed."
        elif text == " ".join(target.text.split()):
            notice = "内容没有变化。 / The text is unchanged."
        else:
            cmd = correct_command(target, text)
            notice = await d.run_command(inbound(cmd), cmd) or ""
            current = await view() or current
    bound.info("card.memory", outcome=ev.op or "back", kind=ev.item_kind[:8], item_id=ev.item_id)
    if d.actions is not None:
        await d.actions.show_memory_card(ev.card_message_id, current, chat_type=chat_type, notice=str(notice))
    return ev.op or "back"
