from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from bot.tools.base import ToolContext, ToolInput, own_words


class MemoryWriteInput(ToolInput):
    content: str = Field(min_length=1, max_length=500,
                         description="One self-contained fact about the user, in the user's language.")
    category: Literal["preference", "decision", "knowledge", "correction"] = Field(
        description="preference | decision | knowledge | correction")


class MemoryWrite:
    name: ClassVar[str] = "memory_write"
    description: ClassVar[str] = (
        "Save one durable fact about the user to long-term memory right away (confidence 0.95). "
        "Use it when the user shares their name, job, a preference, a one-off decision, or "
        "corrects something you remembered (category correction), or says 'remember …'/'记住…'. "
        "Write one short, self-contained sentence about the user. Do not save passwords, keys "
        "or tokens, and do not save things you said yourself."
    )
    Input: ClassVar[type[MemoryWriteInput]] = MemoryWriteInput

    async def run(self, ctx: ToolContext, args: MemoryWriteInput) -> str:
        if "\n" in args.content:
            raise ValueError("content must be one line")
        await own_words(ctx, self.name, args.content, args={"content": args.content})
        write = await ctx.facts.add(ctx.scope, args.content, args.category,
                                    source="agent_proactive", user_text=ctx.user_text,
                                    session_id=ctx.session_id)
        return f"{write.action}: fact #{write.fact.id} ({args.category}, confidence {write.fact.confidence:.2f})"
