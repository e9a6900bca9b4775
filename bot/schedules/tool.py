"""The reminder tools as one provider of the tool port (bot/tools/registry.py):
``schedule_message``, ``list_schedules``, ``cancel_schedule``.

They run bot.schedules.reminders.Reminders in the speaking user's scope (from the event, never the
arguments: ``own_scope``, like the memory tools); the product's checks (past, horizon,
frequency, per-user limit) come back as error results with a sentence the model passes on."""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import BaseModel

from bot.schedules.reminders import CancelScheduleInput, ListSchedulesInput, Reminders, ScheduleMessageInput
from bot.tools.base import ToolContext
from bot.tools.registry import ToolDef

REMINDER_TOOL_TIMEOUT = 15.0

SCHEDULE = (
    "Schedule a reminder or message to the user in this chat at a time (\"提醒我明天九点开会\", "
    "\"every Monday at 10 remind the team about the weekly report\"). Give `at` as an ISO 8601 "
    "local time in the user's zone, and for a repeating one an RFC 5545 `rrule`. The product "
    "refuses times in the past, too far ahead, too frequent, or over the user's limit — tell "
    "the user why if it does. Say the time back to the user and the reminder's id. For a time "
    "relative to now (\"in 20 minutes\", \"明天九点\") you need the current time in the user's zone: "
    "list_schedules' answer starts with it."
)
LIST = ("List the user's active reminders (id, next time in their zone, repeat rule, text); the answer "
        "starts with the current time in the user's zone.")
CANCEL = "Cancel one of the user's reminders by its id (from list_schedules)."


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


class ReminderTools:
    name = "reminders"

    def __init__(self, reminders: Reminders) -> None:
        r = reminders

        async def schedule(ctx: ToolContext, args: dict[str, Any]) -> str:
            return await r.tool_schedule(ctx.scope, ScheduleMessageInput.model_validate(args),
                                         session_id=ctx.session_id)

        async def listing(ctx: ToolContext, args: dict[str, Any]) -> str:
            return await r.tool_list(ctx.scope, ListSchedulesInput.model_validate(args or {}))

        async def cancel(ctx: ToolContext, args: dict[str, Any]) -> str:
            return await r.tool_cancel(ctx.scope, CancelScheduleInput.model_validate(args))

        self._defs = (
            ToolDef("schedule_message", SCHEDULE, _schema(ScheduleMessageInput), schedule, read_only=False,
                    timeout=REMINDER_TOOL_TIMEOUT, own_scope=True),
            ToolDef("list_schedules", LIST, _schema(ListSchedulesInput), listing, read_only=True,
                    timeout=REMINDER_TOOL_TIMEOUT, own_scope=True),
            ToolDef("cancel_schedule", CANCEL, _schema(CancelScheduleInput), cancel, read_only=False,
                    timeout=REMINDER_TOOL_TIMEOUT, own_scope=True),
        )

    def tools(self) -> Sequence[ToolDef]:
        return self._defs
