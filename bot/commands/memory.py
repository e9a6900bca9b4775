"""Slash commands and admin commands, answered without calling the model.

``Commands(deps).run(inbound, text)`` returns the answer, or ``None`` when ``text`` is not
a command (it does not start with ``/`` — or the full-width ``／`` a Chinese IME types —
or its first word holds another slash: ``/etc/hosts 怎么改`` is a question, not a command).
The handler calls it only for messages the bot must answer (p2p, or a group message that
mentions the bot, with the bot's @-placeholder already stripped). Command names and
keywords (``all``, ``confirm``, ``delete``, ``user``) are case-insensitive; an unknown
command gets the help text.

Everything a command shows belongs to the sender (``inbound.sender_id``): in a group,
only memory visible in groups (private, p2p-learned facts and episodes are not shown,
and the profile is only shown in a p2p chat). Bad input gets one short answer; a
command never raises (a failure is logged and answered with an apology).

Answers are Chinese when the command or the sender's latest message in this
conversation is Chinese, English otherwise.

Admin commands (``ETHAN_ADMINS``): ``/reset``, ``/reset user``, ``/stats``. Every admin
action — and every refused attempt (``allowed=0``) — is written to the audit table
(``memory/governance/audit.py``). The audit row of ``/reset user`` names the erased open_id: the one
place it remains, for accountability.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from bot.agent.agent import Memory
from bot.core.inbound import CHANNEL, WEB_API, Inbound
from bot.infra.log import get_logger
from bot.core.text import ambiguous_session, is_chinese, short, when as _when
from memory.governance.audit import AuditLog
from memory.working.consolidation_store import ConsolidationStore
from memory.governance.erase import erase_user, forget_memory
from memory.governance.forget import forget_fact, forget_profile_entry
from memory.profile.modes import COMPANION, WORK, parse_mode
from memory.scope import Scope
from memory.governance.stats import Stats

log = get_logger("ethan.commands")

SLASHES = ("/", "／")
MAX_LISTED = 30            # facts / rules shown by one answer
SESSIONS_LISTED = 20
EPISODES_LISTED = 5
SUMMARY_CHARS = 140
_OPEN_ID = re.compile(r"^ou_[A-Za-z0-9_-]{2,}$")
_ID = re.compile(r"^#?(\d{1,18})$")

SOURCE_NAMES = {
    "consolidator": ("对话中提取", "learned from chat"),
    "agent_proactive": ("对话中记下", "noted in chat"),
    "user_edit": ("你的编辑", "your edit"),
}
CATEGORY_NAMES = {
    "preference": ("偏好", "preference"), "decision": ("决定", "decision"),
    "knowledge": ("知识", "knowledge"), "correction": ("纠正", "correction"),
}
MODE_NAMES = {WORK: ("工作助手", "work assistant"), COMPANION: ("陪伴倾听", "companion (陪伴)")}

HELP = {
    "zh": (
        "可用命令：\n"
        "/help — 显示本帮助\n"
        "/new — 结束当前会话，开始新会话\n"
        "/sessions — 本对话最近 20 个会话\n"
        "/resume <id> — 恢复之前的会话（完整 id 或末尾几位）\n"
        "/memory — 我记住的关于你的事\n"
        "/forget <id> — 删除一条记忆（/forget profile <id> 删除一条画像）；/forget all confirm — 删除你的全部记忆\n"
        "/correct <id> <新内容> — 更正一条记忆（旧的保留为历史；/correct profile|rule <id> <新内容>）\n"
        "/rules — 你的行为规则；/rules delete <id> — 删除一条\n"
        "/profile — 你的画像（仅私聊）\n"
        "/mode work | /mode 陪伴 — 切换工作助手 / 陪伴倾听模式\n"
        "/episodes [关键词] — 你最近的情节记忆，或搜索\n"
        "/reminders — 你的提醒（id、下次时间）；/reminders cancel <id> — 取消一个"
    ),
    "en": (
        "Commands:\n"
        "/help — this help\n"
        "/new — end the current session and start a new one\n"
        "/sessions — the 20 most recent sessions of this conversation\n"
        "/resume <id> — resume an earlier session (full id or its last characters)\n"
        "/memory — what I remember about you\n"
        "/forget <id> — delete one memory (/forget profile <id>: a profile line); /forget all confirm — delete all your memory\n"
        "/correct <id> <new text> — correct a memory (the old one kept as history; /correct profile|rule <id> <text>)\n"
        "/rules — your behaviour rules; /rules delete <id> — delete one\n"
        "/profile — your profile (direct messages only)\n"
        "/mode work | /mode 陪伴 — switch between work assistant and companion mode\n"
        "/episodes [words] — your recent episodes, or search them\n"
        "/reminders — your reminders (id, next time); /reminders cancel <id> — cancel one"
    ),
}
ADMIN_HELP = {
    "zh": "\n管理员：/reset — 重置本对话；/reset user @某人 confirm — 删除该用户的全部数据；/stats — 统计",
    "en": "\nAdmin: /reset — reset this conversation; /reset user @someone confirm — erase that user's data; /stats — statistics",
}


class Confirmation(str):
    """A question before a destructive command: the text asks to type ``confirm``; a transport
    with buttons (Lark's card, bot/lark/outbound/reply.py ``ask_confirm``) shows confirm/cancel
    buttons that run ``command`` (the confirmed form) for the user who asked."""

    command: str

    def __new__(cls, text: str, command: str) -> "Confirmation":
        obj = super().__new__(cls, text)
        obj.command = command
        return obj


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


@dataclass
class Ctx:
    """One command invocation."""

    inbound: Inbound
    name: str
    args: list[str]
    zh: bool
    admin: bool

    @property
    def user(self) -> str:
        return self.inbound.sender_id

    @property
    def private(self) -> bool:
        return self.inbound.chat_type == "p2p"

    @property
    def scope(self) -> Scope:
        return self.inbound.scope(is_admin=self.admin)

    def t(self, zh: str, en: str) -> str:
        return zh if self.zh else en

    def pick(self, pair: tuple[str, str]) -> str:
        return pair[0] if self.zh else pair[1]


WHEN = "%m-%d %H:%M"


def when(ts: float | None) -> str:
    return _when(ts, WHEN)


def tail(open_id: str) -> str:
    return "…" + open_id[-6:] if len(open_id) > 8 else open_id


def parse_id(arg: str) -> int | None:
    m = _ID.match(arg.strip())
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """What /stats shows about the running process."""

    model_calls: int
    model_failures: int
    started_at: float        # epoch seconds; 0 when not started
    # tokens per (provider, model, answers, memory.llm.Usage) since start, chat and consolidation
    usage: tuple = ()


@dataclass
class CommandDeps:
    memory: Memory
    is_admin: Callable[[str], bool]
    bot_open_id: Callable[[], Awaitable[str]]    # the bot's own id: never a /reset user target
    runtime: Callable[[], RuntimeStats]
    reminders: Any = None                         # bot.schedules.reminders.Reminders (None: no reminders)


class Commands:
    def __init__(self, deps: CommandDeps) -> None:
        self.d = deps
        self.mem = deps.memory
        self.db = deps.memory.db
        self.audit = AuditLog(self.db)
        self.table: dict[str, Callable[[Ctx], Awaitable[str]]] = {
            "help": self.help, "h": self.help, "?": self.help, "帮助": self.help,
            "new": self.new, "sessions": self.sessions, "resume": self.resume,
            "memory": self.show_memory, "forget": self.forget, "rules": self.rules,
            "correct": self.correct, "更正": self.correct,
            "profile": self.profile, "mode": self.mode, "episodes": self.episodes,
            "reset": self.reset, "stats": self.stats,
            "reminders": self.reminders, "reminder": self.reminders, "提醒": self.reminders,
        }
        self.admin_only = frozenset({"reset", "stats"})

    # -- plumbing ----------------------------------------------------------------------
    async def run(self, inbound: Inbound, text: str) -> str | None:
        stripped = (text or "").strip()
        if not stripped or stripped[0] not in SLASHES:
            return None
        words = stripped[1:].split()
        if words and any(c in SLASHES for c in words[0]):
            return None          # a path ("/etc/hosts …") or "//", not a command: the model answers
        name = words[0].casefold() if words else "help"
        args = words[1:]
        admin = inbound.admin(self.d.is_admin)
        zh = True
        try:
            zh = await self._chinese(inbound, stripped)
            ctx = Ctx(inbound, name, args, zh, admin)
            log.info("command.run", command=name[:32], chat_id=inbound.chat_id, user_id=inbound.sender_id,
                     chat_type=inbound.chat_type, message_id=inbound.message_id)
            handler = self.table.get(name)
            if handler is None:
                return ctx.t(f"未知命令 /{short(name, 20)}。\n", f"Unknown command /{short(name, 20)}.\n") \
                    + await self.help(ctx)
            if name in self.admin_only and not admin:
                return await self._refuse(ctx)
            if inbound.transport == WEB_API and name in ("memory", "profile", "episodes", "rules"):
                # The /chat token holder reads any user's memory (an operator): on the record.
                await self._audit(ctx, f"{name} read", ctx.user, inbound.chat_id, "", allowed=True,
                                        )
            return await handler(ctx)
        except Exception:  # noqa: BLE001 - a command never takes the handler down
            log.exception("command.failed", command=name[:32], chat_id=inbound.chat_id,
                          user_id=inbound.sender_id)
            return "抱歉，命令没有执行成功，请稍后再试。" if zh else "Sorry — that command failed; please try again."

    async def _chinese(self, inbound: Inbound, text: str) -> bool:
        if is_chinese(text):
            return True
        last = await self.mem.sessions.last_user_text(inbound.conv_key, inbound.sender_id)
        return last is not None and is_chinese(last)

    async def _audit(self, ctx: Ctx, action: str, target: str = "", chat_id: str = "", detail: str = "",
                     allowed: bool = True) -> int:
        """One audit row, naming the channel the command came by (``/chat``: the operator's
        token spoke for this user id, not the user in Lark)."""
        return await self.audit.record(ctx.user, action, target, chat_id, detail, allowed,
                                       channel=CHANNEL.get(ctx.inbound.transport, ctx.inbound.transport))

    async def _refuse(self, ctx: Ctx) -> str:
        user_form = ctx.name == "reset" and bool(ctx.args) and ctx.args[0].casefold() in ("user", "用户")
        action = "reset user" if user_form else ctx.name
        log.warning("command.refused", command=ctx.name, chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                    reason="not an admin")
        await self._audit(ctx, action, "", ctx.inbound.chat_id, "refused: not an admin",
                                allowed=False)
        return ctx.t("抱歉，这是管理员命令，你没有权限。", "Sorry — that is an admin command, and you are not an admin.")

    # -- everyone ------------------------------------------------------------------------
    async def help(self, ctx: Ctx) -> str:
        lang = "zh" if ctx.zh else "en"
        return HELP[lang] + (ADMIN_HELP[lang] if ctx.admin else "")

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
        from memory.sessions.store import AmbiguousSession, SessionNotFound

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

    # -- admins ----------------------------------------------------------------------------
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
