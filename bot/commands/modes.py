"""``/mode``: the sender's mode in this conversation, work assistant or companion
(memory/profile/modes.py). Apart: it changes how Ethan answers, not what it remembers.
"""

from __future__ import annotations

from bot.commands.context import CommandFamily, Ctx
from bot.core.text import short
from memory.profile.modes import COMPANION, WORK, parse_mode

MODE_NAMES = {WORK: ("工作助手", "work assistant"), COMPANION: ("陪伴倾听", "companion (陪伴)")}


class ModeCommands(CommandFamily):
    async def mode(self, ctx: Ctx) -> str:
        conv = ctx.inbound.conv_key
        if not ctx.args:
            current = await self.mem.modes.get(ctx.user, conv)
            return ctx.t(f"当前模式：{MODE_NAMES[current][0]}。切换：/mode work 或 /mode 陪伴",
                         f"Current mode: {MODE_NAMES[current][1]}. Switch with /mode work or /mode 陪伴")
        mode = parse_mode(" ".join(ctx.args))
        if mode is None:
            return ctx.t(f"不认识的模式 “{short(' '.join(ctx.args), 20)}”。可选：/mode work（工作助手）或 /mode 陪伴",
                         f"Unknown mode “{short(' '.join(ctx.args), 20)}”. Use /mode work or /mode 陪伴 (companion)")
        await self.mem.modes.set(ctx.user, conv, mode)
        if mode == COMPANION:
            return ctx.t("已切换到陪伴倾听模式。", "Switched to companion (listening) mode.")
        return ctx.t("已切换到工作助手模式。", "Switched to work assistant mode.")
