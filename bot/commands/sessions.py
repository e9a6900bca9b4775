"""The conversation's sessions: ``/new`` (close the current one; its episode is written),
``/sessions`` (the recent ones), ``/resume <id>`` (go back to one). Apart from the memory
commands because they act on this conversation, not on what Ethan knows about the user.
"""

from __future__ import annotations

from bot.commands.context import WHEN, CommandFamily, Ctx, when
from bot.core.text import ambiguous_session, short

SESSIONS_LISTED = 20


class SessionCommands(CommandFamily):
    async def new(self, ctx: Ctx) -> str:
        closed = await self.mem.sessions.close_active(ctx.inbound.conv_key)
        if closed is None:
            return ctx.t("好的，下一条消息将开始新会话。", "OK — your next message starts a new session.")
        if self.mem.queue is not None:
            self.mem.queue.request_episode(closed)
        return ctx.t(f"已结束会话 {closed.tail}（{closed.user_turns} 轮），下一条消息将开始新会话。",
                     f"Closed session {closed.tail} ({closed.user_turns} turns); your next message starts a new one.")

    async def sessions(self, ctx: Ctx) -> str:
        conv = ctx.inbound.conv_key
        items = await self.mem.sessions.list(conv_key=conv, limit=SESSIONS_LISTED)
        if not items:
            return ctx.t("这个对话还没有会话记录。", "No sessions in this conversation yet.")
        active = await self.mem.sessions.active(conv)
        lines = [ctx.t(f"最近 {len(items)} 个会话（/resume <id> 恢复）：",
                       f"{len(items)} most recent sessions (/resume <id> to resume):")]
        for s in items:
            mark = "▶ " if active is not None and s.id == active.id else "  "
            title = short(s.title, 40) or ctx.t("（无标题）", "(untitled)")
            lines.append(f"{mark}{s.tail}  {when(s.updated_at)}  {title}  "
                         + ctx.t(f"（{s.user_turns} 轮）", f"({s.user_turns} turns)"))
        return "\n".join(lines)

    async def resume(self, ctx: Ctx) -> str:
        from memory.sessions.records import AmbiguousSession, SessionNotFound

        if not ctx.args:
            return ctx.t("用法：/resume <id>（/sessions 查看 id）", "Usage: /resume <id> (see /sessions for ids)")
        ref = ctx.args[0]
        store = self.mem.sessions
        before = await store.active(ctx.inbound.conv_key)
        try:
            resumed = await store.resume(ctx.inbound.conv_key, ref, user_id=ctx.user)
        except AmbiguousSession as e:
            return ambiguous_session(
                ref, e, head=ctx.t(f"“{short(ref, 20)}” 对应多个会话，请多输入几位：",
                                   f"“{short(ref, 20)}” matches several sessions; type more of the id:"),
                more=lambda n: ctx.t(f"  …还有 {n} 个", f"  …and {n} more"), title_chars=30,
                time_format=WHEN)
        except SessionNotFound:
            return ctx.t(f"找不到会话 “{short(ref, 30)}”。用 /sessions 查看可恢复的会话。",
                         f"No session matches “{short(ref, 30)}”. See /sessions for the ones you can resume.")
        if before is not None and before.id != resumed.id and self.mem.queue is not None:
            self.mem.queue.request_episode(before)
        if before is not None and before.id == resumed.id:
            return ctx.t(f"会话 {resumed.tail} 已经是当前会话。", f"Session {resumed.tail} is already the current one.")
        return ctx.t(f"已恢复会话 {resumed.tail}：{short(resumed.title, 40)}（{resumed.user_turns} 轮）",
                     f"Resumed session {resumed.tail}: {short(resumed.title, 40)} ({resumed.user_turns} turns)")
