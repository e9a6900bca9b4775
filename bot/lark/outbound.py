"""Outbound Lark messages, in three modules: ``bot.lark.render`` (uuids, chunks, text vs
post), ``bot.lark.sender`` (``LarkSender``: the Open API calls, retried by Lark's codes, never
doubled) and ``bot.lark.reply`` (``LarkReply``: the ``bot.reply.Reply`` for one Lark message —
reaction, streaming card, text fallback). This module names them together."""

from __future__ import annotations

from bot.lark.openapi import Category
from bot.lark.render import derive_uuid, looks_like_markdown, render, split_text
from bot.lark.reply import LarkReply
from bot.lark.sender import LarkSender, RetryPolicy

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
