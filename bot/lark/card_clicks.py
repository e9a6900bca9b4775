"""A click on one of Ethan's confirm cards, decided at intake and answered in the callback's
own response (issue 25): Lark shows the response's toast, and its card replaces the clicked
one, only if it arrives within 3 s — on the webhook (the HTTP response body) and on the long
connection (the response frame's ``data``) alike. The command itself runs later, in the chat's
mailbox (bot/lark/lifecycle.py), which then shows its outcome on the card.

Who may act is decided from the confirm-card ledger (memory/sessions/chat_events.py), not from the
button's value: a card the bot did not send (or sent longer ago than
``ETHAN_CONFIRM_CARD_MINUTES``) runs nothing, only the user asked may confirm, and only the
first click decides (one conditional UPDATE, atomic across replicas). A refused, repeated or
late click is answered with a toast, its inbox row finished at once — it never reaches the
mailbox. A ``value`` that is not one of Ethan's (a string, another app's card) gets no answer
and no line above info.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bot.commands import memory_clicks
from bot.lark.outbound.cards import confirm_outcome_card, expired_card
from bot.infra.log import get_logger
from memory.governance import audit
from memory.sessions import chat_events

log = get_logger("ethan.lark.cards")

CONFIRM_CARD_MINUTES = 10.0     # ETHAN_CONFIRM_CARD_MINUTES: a confirm card's buttons act this long

# outcome -> (toast type, zh, en); the toast is shown to the clicker only.
TOASTS = {
    "confirmed": ("success", "好的，正在执行。", "Confirmed — on it."),
    "cancelled": ("info", "已取消，什么都没有删除。", "Cancelled — nothing was deleted."),
    "not the user asked": ("warning", "只有提问的人可以确认。", "Only the person asked can confirm."),
    "already done": ("info", "已经处理过了。", "Already done."),
    "expired": ("warning", "这张卡片已过期，请重新发送命令。", "This card has expired — send the command again."),
    "not our card": ("warning", "这不是我发出的确认卡片，什么都没做。", "Not a confirmation card I sent — nothing was done."),
    # a tool-confirm card (bot/tools/confirm.py)
    "tool decided": ("success", "收到。", "Got it."),
    "tool unknown": ("info", "已经处理过了，或已过期。", "Already done, or expired."),
    # the /memory card (bot/lark/outbound/memory_card.py; decided in bot/commands/memory_clicks.py)
    "memory owner only": ("warning", "只有这张卡片的主人可以操作，什么都没改。", "Only the card's owner can do that — nothing changed."),
    "memory on it": ("info", "好的，正在处理。", "OK — on it."),
    "memory not ours": ("warning", "这张卡片与我发出的记忆卡片不符，什么都没改。请重新发送 /memory。",
                        "This is not a /memory card as I sent it — nothing changed. Send /memory again."),
}


def toast(kind: str, locale: str = "zh_cn") -> dict[str, Any]:
    type_, zh, en = TOASTS[kind]
    return {"type": type_, "content": en if locale.startswith("en") else zh,
            "i18n": {"zh_cn": zh, "en_us": en}}


def response(kind: str, card: dict | None = None) -> dict[str, Any]:
    """The callback response body: a toast, and the card that replaces the clicked one."""
    body: dict[str, Any] = {"toast": toast(kind)}
    if card is not None:
        body["card"] = {"type": "raw", "data": card}
    return body


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: str                 # confirmed | cancelled | refused | already | expired | unknown
    response: dict[str, Any]
    acts: bool                   # the inbox row goes on to the mailbox (the command runs there)
    note: str = ""               # the finished row's note when it does not


FINISHED = {  # click verdict -> (Decision.outcome, inbox note)
    "not the user asked": ("refused", "click by another user"),
    "already done": ("already", "card already decided"),
    "expired": ("expired", "card expired"),
    "not our card": ("unknown", "not a card Ethan sent"),
}


class CardClicks:
    """Decides confirm-card clicks at intake (``Intake(on_card_click=…)``)."""

    def __init__(self, db: Any, *, ttl_s: float = CONFIRM_CARD_MINUTES * 60, clock=time.time) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.clock = clock

    async def decide(self, ev: Any, event_id: str) -> Decision | None:
        """None: not a click on an Ethan confirm/cancel button (handled elsewhere, or ignored)."""
        value = ev.action.value or {}
        kind = value.get("ethan")
        card_mid = ev.context.open_message_id
        if kind == "memory" and card_mid:
            return await self._memory(ev, event_id, value)
        if kind not in ("confirm", "cancel") or not card_mid:
            return None
        clicker = ev.operator.open_id
        bound = log.bind(event_id=event_id, user_id=clicker, card_message_id=card_mid,
                         chat_id=ev.context.open_chat_id)
        outcome = "confirmed" if kind == "confirm" else "cancelled"
        card = await chat_events.confirm_card(self.db, card_mid)
        verdict = self._verdict(card, clicker)
        if verdict is None:
            if await chat_events.claim_card(self.db, card_mid, clicker, outcome,
                                            sent_after=self.clock() - self.ttl_s):
                bound.info("card.clicked", outcome=outcome, command=str(value.get("cmd", ""))[:40])
                answer = "" if outcome == "confirmed" else TOASTS["cancelled"][1] + " / " + TOASTS["cancelled"][2]
                shown = confirm_outcome_card(answer, outcome, pending=outcome == "confirmed")
                return Decision(outcome, response(outcome, shown), acts=True)
            # Lost the race to another click (or the TTL passed meanwhile): read again.
            verdict = self._verdict(await chat_events.confirm_card(self.db, card_mid), clicker) or "already done"
        decided, note = FINISHED[verdict]
        bound.info("card.refused", reason=note, asked_by=card.user_id if card else "")
        if verdict in ("not the user asked", "not our card"):
            await audit.record(self.db, clicker, "card.confirm", target=str(value.get("cmd", ""))[:200],
                               chat_id=ev.context.open_chat_id, detail=note, allowed=False)
        return Decision(decided, response(verdict, expired_card() if verdict == "expired" else None),
                        acts=False, note=note)

    async def _memory(self, ev: Any, event_id: str, value: dict) -> Decision:
        """A /memory card button, decided from the card ledger (memory/sessions/chat_events.py
        ``memory_card``), not the value: a card Ethan did not send, another user's click, or a
        value that disagrees with the ledger (``p2p`` on a group's card) is refused here (a
        toast, the row finished: it changes nothing); the owner's goes on to the mailbox
        (bot/commands/memory_clicks.py)."""
        clicker, card_mid = ev.operator.open_id, ev.context.open_message_id
        card = await chat_events.memory_card(self.db, card_mid)
        # the value as bot/lark/events.py reads it into the ButtonClicked the mailbox gets
        why = memory_clicks.verdict(card, clicker, str(value.get("user") or ""), str(value.get("chat_type") or "p2p"))
        if why:
            bound = log.bind(event_id=event_id, user_id=clicker, card_message_id=card_mid,
                             chat_id=ev.context.open_chat_id)
            await memory_clicks.refuse(self.db, bound, clicker=clicker, owner=card.owner if card else "",
                                       item=f"{value.get('kind', '')} {value.get('id', '')}",
                                       chat_id=ev.context.open_chat_id, reason=why)
            kind = "memory owner only" if why == memory_clicks.REFUSED else "memory not ours"
            return Decision("refused", response(kind), acts=False, note=why)
        return Decision("memory", response("memory on it"), acts=True)

    def _verdict(self, card: chat_events.ConfirmCard | None, clicker: str) -> str | None:
        if card is None:
            return "not our card"
        if clicker != card.user_id:
            return "not the user asked"
        if card.outcome != chat_events.ASKED:
            return "already done"
        if self.clock() - card.at > self.ttl_s:
            return "expired"
        return None


def tool_click_response(outcome: str) -> dict[str, Any]:
    """The toast for a click on a tool-confirm card (``ToolConfirmations.click``'s outcome)."""
    return response({"decided": "tool decided", "not the asker": "not the user asked"}.get(outcome, "tool unknown"))
