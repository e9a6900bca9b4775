"""Admin commands (``ETHAN_ADMINS``; the dispatcher refuses and audits anyone else, see
bot/commands/registry.py): ``/reset`` (this conversation), ``/reset user @someone confirm``
(erase a user's data everywhere), ``/stats``. Every admin action writes an audit row; the row
of ``/reset user`` names the erased open_id — the one place it remains, for accountability.
"""

from __future__ import annotations

import re
import time

from bot.commands.context import CommandFamily, Confirmation, Ctx, tail
from bot.infra.log import get_logger
from memory.governance.erase import erase_user
from memory.governance.stats import Stats
from memory.working.consolidation_store import ConsolidationStore

log = get_logger("ethan.commands")

_OPEN_ID = re.compile(r"^ou_[A-Za-z0-9_-]{2,}$")


class AdminCommands(CommandFamily):
    async def reset(self, ctx: Ctx) -> str:
        if ctx.args and ctx.args[0].casefold() in ("user", "用户"):
            return await self._reset_user(ctx)
        if ctx.args:
            return ctx.t("用法：/reset 重置本对话；/reset user @某人 confirm 删除该用户的数据",
                         "Usage: /reset resets this conversation; /reset user @someone confirm erases that user's data")
        conv = ctx.inbound.conv_key
        sessions, working = self.mem.sessions, self.mem.working
        active = await sessions.active(conv)
        if active is not None:
            # No episode for a reset session: mark it covered before closing, so whoever
            # hears about the close (the queue, a restart's recovery) finds nothing to write.
            last = await working.last_message(active.id)
            if last is not None:
                await ConsolidationStore(working.db, working.config).mark_episode(active.id, last.id)
            await sessions.close_active(conv)
        await self._audit(ctx, "reset", conv, ctx.inbound.chat_id,
                                f"closed session {active.id}" if active else "no active session", allowed=True)
        log.info("command.reset", chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                 session_id=active.id if active else "")
        return ctx.t("已重置本对话：当前会话已结束（不生成情节记忆），上下文已清空；长期记忆保留。",
                     "This conversation is reset: the session is closed (no episode) and its context cleared; "
                     "long-term memory stays.")

    async def _target(self, ctx: Ctx, words: list[str]) -> tuple[str, str] | str:
        """(open_id, label) of the user to erase, or an answer explaining what is missing."""
        explicit = [w for w in words if _OPEN_ID.match(w)]
        bot_id = await self.d.bot_open_id()
        mentioned = [m for m in ctx.inbound.mentions
                     if m.open_id and m.open_id != bot_id and m.kind not in ("bot", "all")]
        ids = {*(w for w in explicit), *(m.open_id for m in mentioned)}
        if len(ids) > 1:
            return ctx.t("一次只能删除一个用户的数据，请只 @ 一个人。", "One user at a time: mention only one person.")
        if not ids:
            return ctx.t("请 @ 要删除数据的用户（不能只写名字），或提供其 open_id（ou_…）。",
                         "Mention the user (a typed name is not enough) or give their open_id (ou_…).")
        target = ids.pop()
        name = next((m.name for m in mentioned if m.open_id == target and m.name), "")
        label = f"@{name} ({tail(target)})" if name else tail(target)
        if target == bot_id:
            return ctx.t("不能删除机器人自己。", "That is the bot itself.")
        return target, label

    async def _reset_user(self, ctx: Ctx) -> str:
        words = ctx.args[1:]
        confirmed = any(w.casefold() in ("confirm", "确认") for w in words)
        found = await self._target(ctx, words)
        if isinstance(found, str):
            return found
        target, label = found
        if not confirmed:
            return Confirmation(ctx.t(f"这会在所有对话中永久删除 {label} 的全部数据：记忆、行为规则、画像、情节记忆、"
                         f"TA 发送的消息和对 TA 的回复（只在审计日志中保留一条记录）。"
                         f"确定的话请发送：/reset user {' '.join(w for w in words if w.casefold() not in ('confirm', '确认'))} confirm",
                         f"This permanently erases everything stored about {label} in every conversation: facts, "
                         f"rules, profile, episodes, their messages and the replies to them (only the audit log "
                         f"keeps a record). To go ahead, send: /reset user "
                         f"{' '.join(w for w in words if w.casefold() not in ('confirm', '确认'))} confirm"),
                                f"/reset user {target} confirm")   # the open_id: the click carries no mention
        try:
            result = await erase_user(self.db, target)
        except Exception as e:
            await self._audit(ctx, "reset user", target, ctx.inbound.chat_id,
                                    f"failed: {type(e).__name__}", allowed=True)
            raise
        await self._audit(ctx, "reset user", target, ctx.inbound.chat_id, result.summary(), allowed=True)
        log.warning("command.reset_user", chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                    target_tail=target[-6:], **result.counts)
        c = result.counts
        rebuilt = c.get("episodes_redacted", 0) + c.get("episodes_dropped", 0)
        return ctx.t(f"已删除 {label} 的全部数据（{c.get('facts', 0)} 条记忆、{c.get('profile_entries', 0)} 条画像、"
                     f"{c.get('messages', 0)} 条消息、{c.get('episodes', 0)} 条情节记忆、{c.get('schedules', 0)} 个提醒等）"
                     + (f"；其他成员的 {rebuilt} 条群聊情节记忆已去掉 TA 的话" if rebuilt else "") + "。",
                     f"Erased everything stored about {label} ({c.get('facts', 0)} facts, "
                     f"{c.get('profile_entries', 0)} profile entries, {c.get('messages', 0)} messages, "
                     f"{c.get('episodes', 0)} episodes, {c.get('schedules', 0)} reminders, …)"
                     + (f"; {rebuilt} of other members' group episodes no longer hold their words" if rebuilt else "")
                     + ".")

    async def stats(self, ctx: Ctx) -> str:
        t = await Stats(self.db).totals()
        users, conversations, sessions, messages = t.users, t.conversations, t.sessions, t.messages
        facts, episodes = t.facts, t.episodes
        run, queue = self.d.runtime(), self.mem.queue
        calls, failures = run.model_calls, run.model_failures
        depth = queue.depth if queue is not None else 0
        uptime = int(time.time() - run.started_at) if run.started_at else 0
        await self._audit(ctx, "stats", "", ctx.inbound.chat_id, "", allowed=True)
        usage = _usage_lines(run.usage, ctx.zh)
        if ctx.zh:
            return (f"统计（启动 {uptime // 3600} 小时 {uptime % 3600 // 60} 分钟）：\n"
                    f"用户 {users}，对话 {conversations}，会话 {sessions}，消息 {messages}\n"
                    f"记忆 {facts} 条，情节 {episodes} 条，整理队列 {depth}\n"
                    f"模型调用 {calls} 次，失败 {failures} 次（自启动）" + usage)
        return (f"Stats (up {uptime // 3600}h {uptime % 3600 // 60}m):\n"
                f"users {users}, conversations {conversations}, sessions {sessions}, messages {messages}\n"
                f"facts {facts}, episodes {episodes}, consolidation queue {depth}\n"
                f"model calls {calls}, failures {failures} (since start)" + usage)


def _usage_lines(rows, zh: bool) -> str:
    """Tokens per provider:model since start (chat and consolidation), one line each."""
    out = []
    for provider, model, n, u in rows:
        if zh:
            out.append(f"\n{provider}:{model} — {n} 次回答，输入 {u.input_tokens}，输出 {u.output_tokens}，"
                       f"缓存读 {u.cache_read_tokens}，缓存写 {u.cache_write_tokens} tokens")
        else:
            out.append(f"\n{provider}:{model} — {n} answers, input {u.input_tokens}, output {u.output_tokens}, "
                       f"cache read {u.cache_read_tokens}, cache write {u.cache_write_tokens} tokens")
    return "".join(out)
