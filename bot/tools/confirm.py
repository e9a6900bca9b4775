"""Confirmation of a side-effecting tool call in a group: the asker's click, awaited mid-turn.

The turn that wants to run the tool sends a confirm card (bot/lark/outbound/reply.py ``confirm_tool``)
and waits on a future here; the click is resolved at intake (bot/lark/intake.py), not in the
chat's mailbox, where it would queue behind the very turn that waits for it. Only the asker's
click decides; anyone else's is ignored (logged) and the card keeps waiting.
"""

from __future__ import annotations

import asyncio
import secrets

CONFIRM_WAIT_S = 45.0      # then the call is not run (inside the reply deadline)


class ToolConfirmations:
    def __init__(self) -> None:
        self._pending: dict[str, tuple[str, asyncio.Future]] = {}

    def open(self, asker: str) -> tuple[str, asyncio.Future]:
        token = secrets.token_urlsafe(12)
        fut = asyncio.get_running_loop().create_future()
        self._pending[token] = (asker, fut)
        return token, fut

    def close(self, token: str) -> None:
        self._pending.pop(token, None)

    def click(self, token: str, clicker: str, yes: bool) -> str:
        """'decided', 'not the asker' or 'unknown' (expired, decided, another process's)."""
        entry = self._pending.get(token)
        if entry is None or entry[1].done():
            return "unknown"
        asker, fut = entry
        if clicker != asker:
            return "not the asker"
        fut.set_result(yes)
        return "decided"
