from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from bot.tools.base import ToolContext, ToolInput, own_words

SECTIONS_HINT = "基础特征, 身份与背景, 目标与方向, 工作与沟通方式, 心理与情绪, 个人语言与激励, 与 Agent 的约定"


class ProfileUpdateInput(ToolInput):
    section: str = Field(min_length=1, max_length=40, description=f"One of: {SECTIONS_HINT}")
    entry: str = Field(min_length=1, max_length=300, description="One line to write under that section.")
    mode: Literal["append", "overwrite", "merge"] = Field(
        default="append",
        description="append (add a bullet, default), overwrite (replace the section), merge (replace a similar or contradicting bullet, else add)")


class ProfileUpdate:
    name: ClassVar[str] = "profile_update"
    description: ClassVar[str] = (
        "Update the user's profile document (narrative information that is not a single fact): "
        "basic traits the user states (name, age, personality, interests → 基础特征), identity and "
        "background, long-term goals (目标与方向), communication and work style, feelings (心理与情绪), "
        "the user's own words and motivating phrases, and agreements with you (与 Agent 的约定). "
        f"Sections: {SECTIONS_HINT}. Use merge when the entry updates something already there."
    )
    Input: ClassVar[type[ProfileUpdateInput]] = ProfileUpdateInput

    async def run(self, ctx: ToolContext, args: ProfileUpdateInput) -> str:
        await own_words(ctx, self.name, args.entry, args={"section": args.section, "entry": args.entry})
        return await ctx.profile.update(ctx.scope, args.section, args.entry, args.mode,
                                        source="agent_proactive", session_id=ctx.session_id)
