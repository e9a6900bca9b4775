"""What Ethan knows about the sender, shown and governed by the sender: ``/memory`` (facts,
profile lines, rules, each with where it was learned — the text, or the card a transport with
buttons draws from ``MemoryView``), ``/forget``, ``/correct``, ``/rules``, ``/profile``,
``/episodes``. ``MemoryItem``, ``MemoryView``, ``forget_command`` and ``correct_command`` are the
contract of the /memory card (bot/lark/outbound/memory_card.py draws it,
bot/commands/memory_clicks.py runs its buttons).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bot.commands.context import MAX_LISTED, CommandFamily, Confirmation, Ctx, parse_id, tail, when
from bot.core.text import short, when as _when
from bot.infra.log import get_logger
from memory.governance.erase import forget_memory
from memory.governance.forget import forget_fact, forget_profile_entry

log = get_logger("ethan.commands")

EPISODES_LISTED = 5
SUMMARY_CHARS = 140

SOURCE_NAMES = {
    "consolidator": ("对话中提取", "learned from chat"),
    "agent_proactive": ("对话中记下", "noted in chat"),
    "user_edit": ("你的编辑", "your edit"),
}
CATEGORY_NAMES = {
    "preference": ("偏好", "preference"), "decision": ("决定", "decision"),
    "knowledge": ("知识", "knowledge"), "correction": ("纠正", "correction"),
}


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One thing Ethan knows about the user, as /memory shows it (and its card's buttons act on)."""

    kind: str          # fact | profile | rule
    id: int
    text: str
    label: str         # the fact's category, the profile section, "rule"
    learned: str       # where and when it was learned (provenance), one short line


class MemoryView(str):
    """/memory's answer: the text for transports without cards (console, terminal, /chat), and
    the items for a transport that shows them as a card with Forget / Correct buttons (Lark,
    bot/lark/outbound/memory_card.py). The buttons run the typed commands (``forget_command`` /
    ``correct_command``) for the owner only."""

    items: tuple[MemoryItem, ...]
    owner: str
    zh: bool
    more: int            # items left out of the card (MAX_LISTED per kind)
    note: str            # a line under the list ("" none)

    def __new__(cls, text: str, *, items: tuple[MemoryItem, ...], owner: str, zh: bool, more: int = 0,
                note: str = "") -> "MemoryView":
        obj = super().__new__(cls, text)
        obj.items, obj.owner, obj.zh, obj.more, obj.note = items, owner, zh, more, note
        return obj


def forget_command(item: MemoryItem) -> str:
    """The typed command a Forget button runs."""
    return {"fact": f"/forget {item.id}", "profile": f"/forget profile {item.id}",
            "rule": f"/rules delete {item.id}"}[item.kind]


def correct_command(item: MemoryItem, text: str) -> str:
    """The typed command a Correct button's form runs with the new text."""
    word = {"fact": "", "profile": "profile ", "rule": "rule "}[item.kind]
    return f"/correct {word}{item.id} {' '.join(text.split())}"


class MemoryCommands(CommandFamily):
    def _learned(self, ctx: Ctx, source: str, places: list[tuple[str, str, float]], private: bool) -> str:
        """Where and when something was learned: the chat (this one, the direct chat, a group),
        the message, the date — each place it was learned, newest first (at most 3).
        ``private``: learned in a direct chat (the item's visibility)."""
        src = ctx.pick(SOURCE_NAMES.get(source, (source, source)))
        out = []
        for chat_id, message_id, ts in sorted(places, key=lambda p: -p[2])[:3]:
            if not chat_id:
                where = ctx.t("控制台", "console")
            elif chat_id == ctx.inbound.chat_id:
                where = ctx.t("本对话", "this chat")
            elif private:
                where = ctx.t("私聊", "direct chat")
            else:
                where = ctx.t(f"群聊 {tail(chat_id)}", f"group {tail(chat_id)}")
            msg = f" {ctx.t('消息', 'message')} {tail(message_id)}" if message_id else ""
            out.append(f"{where}{msg} {_when(ts, '%Y-%m-%d')}")
        more = ctx.t(f"，另 {len(places) - 3} 处", f", +{len(places) - 3} more") if len(places) > 3 else ""
        return f"{src} · " + "; ".join(out) + more if out else src

    async def memory_items(self, ctx: Ctx) -> tuple[list[MemoryItem], int]:
        """What Ethan knows about the sender, visible here: facts (in a group: shared ones),
        profile lines (direct chat only), the sender's own rules; and how many were left out."""
        facts = await self.mem.facts.list(ctx.user)
        if not ctx.private:
            facts = [f for f in facts if f.visibility == "shared"]
        sources = getattr(self.mem.facts, "sources", None)     # every place a fact was learned
        places = await sources(ctx.user, [f.id for f in facts[:MAX_LISTED]]) if sources else {}
        items = [MemoryItem("fact", f.id, f.content,
                            f"{ctx.pick(CATEGORY_NAMES.get(f.category, (f.category,) * 2))} {f.confidence:.2f}",
                            self._learned(ctx, f.source, places.get(f.id) or [(f.chat_id, f.message_id, f.created_at)],
                                         f.visibility == "private"))
                 for f in facts[:MAX_LISTED]]
        more = max(0, len(facts) - MAX_LISTED)
        if ctx.private:
            entries = await self.mem.profile.list(ctx.user)
            items += [MemoryItem("profile", e.id, e.entry, e.section,
                                 self._learned(ctx, e.source, [(e.chat_id, e.message_id, e.updated_at)],
                                               e.visibility == "private"))
                      for e in entries[:MAX_LISTED]]
            more += max(0, len(entries) - MAX_LISTED)
        rules = [r for r in await self.mem.procedures.list(ctx.user) if r.scope == "user"]
        items += [MemoryItem("rule", r.id, r.rule, ctx.t("规则", "rule"),
                             self._learned(ctx, "agent_proactive", [(r.chat_id, r.message_id, r.created_at)],
                                           r.visibility == "private"))
                  for r in rules[:MAX_LISTED]]
        return items, more + max(0, len(rules) - MAX_LISTED)

    async def show_memory(self, ctx: Ctx) -> str:
        items, more = await self.memory_items(ctx)
        note = "" if ctx.private else ctx.t("（私聊中记下的和画像不在群里显示）",
                                            "(What I learned in our direct chat, and your profile, are not shown here.)")
        if not items:
            return ctx.t("我还没有记住关于你的事。", "I don't remember anything about you yet.") + (
                f" {note}" if note else "")
        head = ctx.t(f"我记住的关于你的事（{len(items)} 条；/forget <id> 删除，/correct <id> <新内容> 更正）：",
                     f"What I remember about you ({len(items)}; /forget <id> deletes one, "
                     f"/correct <id> <new text> corrects it):")
        lines = [head]
        for it in items:
            ref = {"fact": f"#{it.id}", "profile": f"profile {it.id}", "rule": f"rule {it.id}"}[it.kind]
            lines.append(f"{ref} [{it.label}] {short(it.text, 120)}  — {it.learned}")
        if more:
            lines.append(ctx.t(f"…还有 {more} 条", f"…and {more} more"))
        if note:
            lines.append(note)
        return MemoryView("\n".join(lines), items=tuple(items), owner=ctx.user, zh=ctx.zh, more=more, note=note)

    async def forget(self, ctx: Ctx) -> str:
        if not ctx.args:
            return ctx.t("用法：/forget <id>（/memory 查看 id），或 /forget all confirm 删除全部记忆",
                         "Usage: /forget <id> (see /memory for ids), or /forget all confirm to delete all your memory")
        first = ctx.args[0].casefold()
        if first in ("all", "全部"):
            if len(ctx.args) < 2 or ctx.args[1].casefold() not in ("confirm", "确认"):
                return Confirmation(ctx.t("这会删除我记住的关于你的一切：记忆、行为规则、画像、情节记忆和提醒（聊天记录保留）。"
                             "确定的话请发送：/forget all confirm",
                             "This deletes everything I remember about you: facts, behaviour rules, profile, "
                             "episodes and reminders (chat history stays). To go ahead, send: /forget all confirm"),
                                    "/forget all confirm")
            result = await forget_memory(self.db, ctx.user)
            c = result.counts
            log.info("command.forget_all", chat_id=ctx.inbound.chat_id, user_id=ctx.user, **c)
            return ctx.t(f"已删除：{c['facts']} 条记忆、{c['procedures']} 条规则、{c['profile_entries']} 条画像、"
                         f"{c['episodes']} 条情节记忆、{c['schedules']} 个提醒。",
                         f"Deleted: {c['facts']} facts, {c['procedures']} rules, {c['profile_entries']} profile "
                         f"entries, {c['episodes']} episodes, {c['schedules']} reminders.")
        if first in ("profile", "画像"):
            return await self._forget_profile(ctx)
        fact_id = parse_id(ctx.args[0])
        if fact_id is None:
            return ctx.t(f"“{short(ctx.args[0], 20)}” 不是记忆 id。用 /memory 查看 id。",
                         f"“{short(ctx.args[0], 20)}” is not a memory id. See /memory for ids.")
        fact = await self.mem.facts.get(ctx.user, fact_id)
        if fact is None:
            return ctx.t(f"没有找到你的记忆 #{fact_id}。", f"You have no memory #{fact_id}.")
        if not ctx.private and fact.visibility != "shared":
            return ctx.t(f"记忆 #{fact_id} 是私聊中记下的，请在私聊中删除。",
                         f"Memory #{fact_id} was learned in our direct chat; delete it there.")
        # the fact, and what states it in episodes, summaries and profile (memory/governance/forget.py)
        counts = await forget_fact(self.db, ctx.user, fact_id)
        if counts is None:
            return ctx.t(f"没有找到你的记忆 #{fact_id}。", f"You have no memory #{fact_id}.")
        log.info("command.forget", chat_id=ctx.inbound.chat_id, user_id=ctx.user, fact_id=fact_id, **counts)
        return ctx.t(f"已删除记忆 #{fact_id}：{short(fact.content, 80)}",
                     f"Deleted memory #{fact_id}: {short(fact.content, 80)}")

    async def _forget_profile(self, ctx: Ctx) -> str:
        entry_id = parse_id(ctx.args[1]) if len(ctx.args) > 1 else None
        if entry_id is None:
            return ctx.t("用法：/forget profile <id>（/memory 查看 id）", "Usage: /forget profile <id> (see /memory for ids)")
        if not ctx.private:
            return ctx.t("画像只在私聊中管理，请私聊我。", "Your profile is managed in a direct chat only: send me this there.")
        entry = await self.mem.profile.get(ctx.user, entry_id)
        counts = await forget_profile_entry(self.db, ctx.user, entry_id) if entry is not None else None
        if entry is None or counts is None:
            return ctx.t(f"没有找到你的画像条目 {entry_id}。", f"You have no profile line {entry_id}.")
        log.info("command.forget", chat_id=ctx.inbound.chat_id, user_id=ctx.user, profile_entry_id=entry_id, **counts)
        return ctx.t(f"已删除画像条目 {entry_id}：{short(entry.entry, 80)}",
                     f"Deleted profile line {entry_id}: {short(entry.entry, 80)}")

    async def correct(self, ctx: Ctx) -> str:
        """``/correct <id> <new text>`` (a fact: superseded, the old one kept as history),
        ``/correct profile <id> <text>``, ``/correct rule <id> <text>`` — what the /memory
        card's Correct button runs with the text typed into the card."""
        args = list(ctx.args)
        kind = "fact"
        if args and args[0].casefold() in ("profile", "画像", "rule", "rules", "规则"):
            kind = "profile" if args[0].casefold() in ("profile", "画像") else "rule"
            args = args[1:]
        item_id = parse_id(args[0]) if args else None
        text = " ".join(args[1:]).strip()
        if item_id is None or not text:
            return ctx.t("用法：/correct <id> <新内容>（/memory 查看 id；画像和规则：/correct profile|rule <id> <新内容>）",
                         "Usage: /correct <id> <new text> (see /memory for ids; profile lines and rules: "
                         "/correct profile|rule <id> <new text>)")
        try:
            if kind == "profile":
                if not ctx.private:
                    return ctx.t("画像只在私聊中管理，请私聊我。", "Your profile is managed in a direct chat only.")
                entry = await self.mem.profile.correct(ctx.scope, item_id, text)
                if entry is None:
                    return ctx.t(f"没有找到你的画像条目 {item_id}。", f"You have no profile line {item_id}.")
                log.info("command.correct", kind=kind, chat_id=ctx.inbound.chat_id, user_id=ctx.user, item_id=item_id)
                return ctx.t(f"已更正画像条目 {item_id}：{short(entry.entry, 80)}",
                             f"Corrected profile line {item_id}: {short(entry.entry, 80)}")
            if kind == "rule":
                mine = {r.id: r for r in await self.mem.procedures.list(ctx.user) if r.scope == "user"}
                if item_id not in mine:
                    return ctx.t(f"没有找到你的规则 #{item_id}。", f"You have no rule #{item_id}.")
                scope = replace(ctx.scope, is_admin=False)
                new, _ = await self.mem.procedures.add(scope, text, mine[item_id].context)
                if new.id != item_id:
                    await self.mem.procedures.delete(scope, item_id)
                log.info("command.correct", kind=kind, chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                         item_id=item_id, new_id=new.id)
                return ctx.t(f"已更正规则 #{item_id} → #{new.id}：{short(new.rule, 80)}",
                             f"Corrected rule #{item_id} → #{new.id}: {short(new.rule, 80)}")
            old = await self.mem.facts.get(ctx.user, item_id)
            if old is None or not old.active:
                return ctx.t(f"没有找到你的记忆 #{item_id}。", f"You have no memory #{item_id}.")
            if not ctx.private and old.visibility != "shared":
                return ctx.t(f"记忆 #{item_id} 是私聊中记下的，请在私聊中更正。",
                             f"Memory #{item_id} was learned in our direct chat; correct it there.")
            # the user's words replace the fact: it is superseded (kept with its end time), the
            # new one is theirs (user_edit) and as private as the old one was
            write = await self.mem.facts.add(ctx.scope, text, old.category, source="user_edit",
                                             decision=("update", old.id))
            fact = write.fact
            if old.visibility == "private" and fact.visibility != "private":
                fact = await self.mem.facts.update(ctx.user, fact.id, visibility="private") or fact
        except (ValueError, PermissionError) as e:
            return ctx.t(f"没有更正：{short(str(e), 120)}", f"Not corrected: {short(str(e), 120)}")
        log.info("command.correct", kind=kind, chat_id=ctx.inbound.chat_id, user_id=ctx.user, item_id=item_id,
                 new_id=fact.id, action=write.action)
        return ctx.t(f"已更正记忆 #{item_id} → #{fact.id}：{short(fact.content, 80)}（旧的保留为历史）",
                     f"Corrected memory #{item_id} → #{fact.id}: {short(fact.content, 80)} (the old one is kept as history)")

    async def rules(self, ctx: Ctx) -> str:
        if ctx.args and ctx.args[0].casefold() in ("delete", "del", "rm", "remove", "删除"):
            return await self._rules_delete(ctx)
        if ctx.args:
            return ctx.t("用法：/rules 查看，/rules delete <id> 删除", "Usage: /rules to list, /rules delete <id> to delete")
        store = self.mem.procedures
        items = await store.list(ctx.user, ctx.inbound.chat_id if ctx.admin else None)
        if not items:
            return ctx.t("你还没有行为规则。", "You have no behaviour rules yet.")
        lines = [ctx.t("行为规则（/rules delete <id> 删除）：", "Behaviour rules (/rules delete <id> to delete):")]
        for p in items[:MAX_LISTED]:
            where = ctx.t("[本群] ", "[this chat] ") if p.scope == "chat" else ""
            context = f"  — {short(p.context, 60)}" if p.context else ""
            lines.append(f"#{p.id} {where}{short(p.rule, 120)}{context}")
        if len(items) > MAX_LISTED:
            lines.append(ctx.t(f"…还有 {len(items) - MAX_LISTED} 条", f"…and {len(items) - MAX_LISTED} more"))
        return "\n".join(lines)

    async def _rules_delete(self, ctx: Ctx) -> str:
        rule_id = parse_id(ctx.args[1]) if len(ctx.args) > 1 else None
        if rule_id is None:
            return ctx.t("用法：/rules delete <id>（/rules 查看 id）", "Usage: /rules delete <id> (see /rules for ids)")
        store = self.mem.procedures
        visible = {p.id: p for p in await store.list(ctx.user, ctx.inbound.chat_id)}
        rule = visible.get(rule_id)
        try:
            deleted = await store.delete(ctx.scope, rule_id)
        except PermissionError:
            await self._refuse_quietly(ctx, "rules delete", f"chat rule #{rule_id}")
            return ctx.t("只有管理员可以删除本群的规则。", "Only an admin can delete this chat's rules.")
        if not deleted:
            return ctx.t(f"没有找到你的规则 #{rule_id}。", f"You have no rule #{rule_id}.")
        if rule is not None and rule.scope == "chat":
            await self._audit(ctx, "rules delete", ctx.inbound.chat_id, ctx.inbound.chat_id,
                                    f"chat rule #{rule_id}", allowed=True)
        text = f"：{short(rule.rule, 80)}" if rule is not None else ""
        return ctx.t(f"已删除规则 #{rule_id}{text}", f"Deleted rule #{rule_id}{text.replace('：', ': ')}")

    async def _refuse_quietly(self, ctx: Ctx, action: str, detail: str) -> None:
        log.warning("command.refused", command=action, chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                    reason="not an admin")
        await self._audit(ctx, action, ctx.inbound.chat_id, ctx.inbound.chat_id,
                                f"refused: {detail}", allowed=False)

    async def profile(self, ctx: Ctx) -> str:
        if not ctx.private:
            return ctx.t("画像只在私聊中查看，请私聊我发送 /profile。",
                         "Your profile is shown only in a direct chat: send me /profile there.")
        doc = await self.mem.profile.export_document(ctx.user)
        if not doc.strip():
            return ctx.t("你的画像还是空的。", "Your profile is empty so far.")
        return doc.strip()

    async def episodes(self, ctx: Ctx) -> str:
        store = self.mem.episodes
        query = " ".join(ctx.args).strip()
        if query:
            found = await store.search(ctx.user, query, limit=EPISODES_LISTED, scope=ctx.scope)
            if not found:
                return ctx.t(f"没有找到和 “{short(query, 30)}” 相关的情节记忆。",
                             f"No episodes match “{short(query, 30)}”.")
            head = ctx.t(f"和 “{short(query, 30)}” 相关的情节记忆：", f"Episodes matching “{short(query, 30)}”:")
        else:
            found = await store.recent(ctx.user, EPISODES_LISTED, scope=ctx.scope)   # this chat's only
            if not found:
                return ctx.t("还没有情节记忆（会话结束后生成）。", "No episodes yet (one is written when a session ends).")
            head = ctx.t("你最近的情节记忆：", "Your recent episodes:")
        lines = [head]
        for e in found:
            keywords = f"  [{', '.join(e.keywords[:5])}]" if e.keywords else ""
            lines.append(f"{when(e.timestamp)}{keywords}\n  {short(e.summary, SUMMARY_CHARS)}")
        if not ctx.private:
            lines.append(ctx.t("（私聊和其他群的情节不在这里显示）",
                               "(Episodes of our direct chat and of other groups are not shown here.)"))
        return "\n".join(lines)
