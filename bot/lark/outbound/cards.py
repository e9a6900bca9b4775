"""Card JSON for answers streamed into a CardKit card.

A streaming answer is a card entity (JSON 2.0, ``streaming_mode: true``) with one
markdown element; the bot pushes the full text so far to that element (CardKit
renders the new suffix with a typewriter effect), then turns streaming mode off,
setting the chat-list preview (``summary``) to the start of the answer.

Limits we design for (Open Platform docs, "streaming updates" and CardKit API
pages): at most 10 operations per second on one card entity; every update carries
a strictly increasing ``sequence``; streaming mode closes by itself after ~10
minutes; a card's JSON must stay under ~30 KB, so the streamed element is capped
(``CARD_TEXT_MAX_BYTES``) and anything beyond goes out as follow-up messages.
"""

from __future__ import annotations

import json
from typing import Any

ELEMENT_ID = "answer"
STREAMING_SUMMARY = "…"
PLACEHOLDER = "…"
SUMMARY_CHARS = 60
# Card JSON must stay under ~30 KB; leave room for the envelope.
CARD_TEXT_MAX_BYTES = 24_000


def streaming_card(text: str, *, element_id: str = ELEMENT_ID) -> dict[str, Any]:
    """A JSON 2.0 card in streaming mode with one markdown element holding ``text``."""
    return {
        "schema": "2.0",
        "config": {
            "streaming_mode": True,
            "update_multi": True,  # required by the streaming APIs (no per-user cards)
            "summary": {"content": STREAMING_SUMMARY},
            "streaming_config": {
                "print_frequency_ms": {"default": 30},
                "print_step": {"default": 2},
                "print_strategy": "fast",
            },
        },
        "body": {
            "elements": [
                {"tag": "markdown", "element_id": element_id, "content": text or PLACEHOLDER},
            ]
        },
    }


def summary_of(text: str, limit: int = SUMMARY_CHARS) -> str:
    """A one-line preview of ``text`` for the chat list."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def close_streaming_settings(final_text: str) -> dict[str, Any]:
    """``settings`` for ``PATCH …/cards/:card_id/settings`` ending streaming mode."""
    return {"config": {"streaming_mode": False, "summary": {"content": summary_of(final_text) or PLACEHOLDER}}}


def card_reference(card_id: str) -> dict[str, Any]:
    """Message content (msg_type ``interactive``) that shows the card entity ``card_id``."""
    return {"type": "card", "data": {"card_id": card_id}}


def card_entity_body(card: dict[str, Any]) -> dict[str, str]:
    """The ``{type, data}`` pair CardKit takes for a card JSON (create and full update)."""
    return {"type": "card_json", "data": json.dumps(card, ensure_ascii=False)}


def fit_card_text(text: str, max_bytes: int = CARD_TEXT_MAX_BYTES) -> str:
    """The longest prefix of ``text`` under ``max_bytes`` UTF-8 bytes (no broken characters)."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    return raw[:max_bytes].decode("utf-8", errors="ignore")


def label(zh: str, en: str) -> dict[str, Any]:
    """A button's text in the reader's language: Lark picks ``i18n_content`` by the client's
    locale; ``content`` (both) is for clients that do not."""
    return {"tag": "plain_text", "content": f"{zh} {en}", "i18n_content": {"zh_cn": zh, "en_us": en}}


def confirm_card(question: str, *, command: str, user_id: str, chat_type: str) -> dict[str, Any]:
    """A destructive command's question with confirm/cancel buttons (JSON 2.0). The buttons'
    values carry the command and who asked: only that user's click acts (bot/lark/lifecycle.py)."""
    def button(text: dict[str, Any], kind: str, style: str) -> dict[str, Any]:
        return {"tag": "button", "text": text, "type": style,
                "behaviors": [{"type": "callback", "value": {
                    "ethan": kind, "cmd": command, "user": user_id, "chat_type": chat_type}}]}
    return _question_card(question, button(label("确认删除", "Confirm"), "confirm", "danger"),
                          button(label("取消", "Cancel"), "cancel", "default"))


def _question_card(question: str, yes: dict[str, Any], no: dict[str, Any]) -> dict[str, Any]:
    """A question and two buttons side by side (JSON 2.0), updatable once answered."""
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": summary_of(question)}},
        "body": {"elements": [
            {"tag": "markdown", "content": question},
            {"tag": "column_set", "columns": [
                {"tag": "column", "elements": [yes]},
                {"tag": "column", "elements": [no]},
            ]},
        ]},
    }


def tool_confirm_card(question: str, *, token: str, user_id: str) -> dict[str, Any]:
    """A side-effecting tool call in a group, waiting for the asker's click (bot/tools/confirm.py)."""
    def button(text: dict[str, Any], kind: str, style: str) -> dict[str, Any]:
        return {"tag": "button", "text": text, "type": style,
                "behaviors": [{"type": "callback", "value": {"ethan": kind, "token": token, "user": user_id}}]}
    return _question_card(question, button(label("确认执行", "Run it"), "tool_confirm", "primary"),
                          button(label("取消", "Cancel"), "tool_cancel", "default"))


def confirm_outcome_card(answer: str, outcome: str, *, pending: bool = False) -> dict[str, Any]:
    """The card after the click: the outcome, no buttons (a second click has nothing to press).
    ``pending``: confirmed, the command still running (the callback's own answer; the card is
    updated again with the command's answer)."""
    title = ("⏳ 已确认，执行中… Confirmed — working" if pending
             else "✅ 已执行 Done" if outcome == "confirmed" else "↩️ 已取消 Cancelled")
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": summary_of(answer or title)}},
        "body": {"elements": [{"tag": "markdown", "content": f"**{title}**\n\n{answer}".rstrip()}]},
    }


def expired_card() -> dict[str, Any]:
    """A confirm card clicked after its time: no buttons, say how to ask again."""
    title = "⌛ 已过期 Expired"
    text = "这张卡片已过期，什么都没做；请重新发送命令。 / This card has expired and nothing was done; send the command again."
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": summary_of(title)}},
        "body": {"elements": [{"tag": "markdown", "content": f"**{title}**\n\n{text}"}]},
    }
