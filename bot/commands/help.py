"""``/help`` (also ``/h``, ``/?``, ``/帮助``, and the answer to an unknown command): the command
list in both languages, with the admin line for admins. Apart because the help text is what a
user reads about every other family.
"""

from __future__ import annotations

from bot.commands.context import CommandFamily, Ctx

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


class HelpCommands(CommandFamily):
    async def help(self, ctx: Ctx) -> str:
        lang = "zh" if ctx.zh else "en"
        return HELP[lang] + (ADMIN_HELP[lang] if ctx.admin else "")
