"""``/reminders`` (also ``/reminder``, ``/提醒``): the sender's reminders, the ones missed while
Ethan was down, and ``/reminders cancel <id>`` — over bot/schedules/reminders.py. Apart: the
schedules capability's one command.
"""

from __future__ import annotations

from bot.commands.context import MAX_LISTED, CommandFamily, Ctx, parse_id, tail
from bot.core.text import short


class ReminderCommands(CommandFamily):
    async def reminders(self, ctx: Ctx) -> str:
        """``/reminders``: the sender's own (an admin in a group: the chat's, everyone's), with
        ids, and the occurrences skipped while Ethan was down; ``/reminders cancel <id>``."""
        from bot.schedules.reminders import describe
        from memory.schedules.recurrence import local_iso

        r = self.d.reminders
        if r is None:
            return ctx.t("提醒功能未启用。", "Reminders are not available here.")
        if ctx.args and ctx.args[0].casefold() in ("cancel", "delete", "del", "rm", "取消", "删除"):
            job_id = parse_id(ctx.args[1]) if len(ctx.args) > 1 else None
            if job_id is None:
                return ctx.t("用法：/reminders cancel <id>（/reminders 查看 id）",
                             "Usage: /reminders cancel <id> (see /reminders for ids)")
            if not await r.cancel(ctx.scope, job_id, admin=ctx.admin and not ctx.private):
                return ctx.t(f"没有找到你的提醒 #{job_id}。", f"You have no active reminder #{job_id}.")
            return ctx.t(f"已取消提醒 #{job_id}。", f"Cancelled reminder #{job_id}.")
        chat = ctx.admin and not ctx.private
        jobs = await r.list(ctx.scope, chat=chat)
        lines = [describe(j, zh=ctx.zh) + (f"  ({tail(j.owner_id)})" if chat and j.owner_id != ctx.user else "")
                 for j in jobs[:MAX_LISTED]]
        head = (ctx.t("本群的提醒：", "This chat's reminders:") if chat else ctx.t("你的提醒：", "Your reminders:"))
        out = [head, *lines] if lines else [ctx.t("没有待发的提醒。", "No reminders pending.")]
        missed = await r.missed(ctx.scope)
        if missed:
            out.append(ctx.t("错过的（Ethan 当时未运行，已超过宽限时间，未发送）：",
                             "Missed (Ethan was not running and the grace window had passed; not sent):"))
            out += [f"#{j.id} {local_iso(d.due_at, j.tz)} — {short(j.text, 60)}" for j, d in missed[:10]]
        if lines:
            out.append(ctx.t("取消：/reminders cancel <id>", "Cancel one: /reminders cancel <id>"))
        return "\n".join(out)
