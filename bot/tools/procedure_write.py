from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from bot.tools.base import ToolContext, ToolError, ToolInput, own_words


class ProcedureWriteInput(ToolInput):
    rule: str = Field(min_length=1, max_length=500,
                      description="The behaviour rule, as an instruction to yourself, e.g. 'Always reply in Chinese'.")
    context: str = Field(default="", max_length=300, description="Why or when it applies, e.g. '用户明确要求'.")
    applies_to: Literal["me", "this_chat"] = Field(
        default="me",
        description="'me' (the speaking user, default) or 'this_chat' (every member of this chat; admins only).")


class ProcedureWrite:
    name: ClassVar[str] = "procedure_write"
    description: ClassVar[str] = (
        "Save a standing behaviour rule that applies to every later reply, e.g. when the user "
        "says 'from now on always answer in English', '以后回复都用中文', 'don't use emoji'. "
        "Rules are shown to you in <behavioral_guidelines> on every turn."
    )
    Input: ClassVar[type[ProcedureWriteInput]] = ProcedureWriteInput

    async def run(self, ctx: ToolContext, args: ProcedureWriteInput) -> str:
        chat_scope = args.applies_to == "this_chat"
        if chat_scope and not ctx.scope.is_admin:
            raise ToolError("only admins can set rules for the whole chat; save it for the user instead (applies_to='me')")
        # A rule is what injected text wants most (the persona follows it on every turn): the
        # same gate as facts and profile, and no "about someone else" way round it. Only the
        # rule reaches the prompt; ``context`` is a note shown with it in /rules.
        await own_words(ctx, self.name, args.rule, args={"rule": args.rule}, others_ok=False)
        proc, created = await ctx.procedures.add(ctx.scope, args.rule, args.context, chat_scope=chat_scope)
        return f"{'saved' if created else 'already known'}: rule #{proc.id}"
