"""Outbound Lark messages, in three modules: ``bot.lark.outbound.render`` (uuids, chunks, text vs
post), ``bot.lark.outbound.sender`` (``LarkSender``: the Open API calls, retried by Lark's codes, never
doubled) and ``bot.lark.outbound.reply`` (``LarkReply``: the ``bot.core.reply.Reply`` for one Lark message —
reaction, streaming card, text fallback). This module names them together."""

from __future__ import annotations

from bot.lark.openapi.client import Category
from bot.lark.outbound.render import derive_uuid, looks_like_markdown, render, split_text
from bot.lark.outbound.reply import LarkReply
from bot.lark.outbound.sender import LarkSender, RetryPolicy

__all__ = [
    "Category",
    "LarkReply",
    "LarkSender",
    "RetryPolicy",
    "derive_uuid",
    "looks_like_markdown",
    "render",
    "split_text",
]
