"""Start-up steps of what answers: ``tools`` (memory tools, Feishu documents, MCP servers —
connected before the port serves chats; stopping it stops the MCP servers), ``agent``,
``reminders`` (the schedule store, users' time zones, the reminder tools) and ``commands``.
Apart because this is where a capability the model can use is registered: add a tool provider
in ``start_tools`` with ``app.tools.add(provider)``.
"""

from __future__ import annotations

from typing import Any

from bot.agent.agent import Agent
from bot.commands.context import CommandDeps
from bot.commands.dispatcher import Commands
from bot.startup.lifespan import Boot, Shutdown
from bot.tools import memory_tools
from bot.tools.lark_docs import LarkDocs
from bot.tools.mcp import McpServers
from bot.tools.registry import ToolRegistry


async def start_tools(app: Any, boot: Boot) -> None:
    s = app.settings
    app.tools = ToolRegistry([memory_tools()], policy=s.tools.policy(), on_call=app.metrics.count_tool,
                             max_result_chars=s.tools.max_result_chars)
    # MCP servers (config.yaml mcp_servers:): connected before the port serves chats; one
    # that fails is logged, shown in /healthz, retried, and its tools are simply not offered.
    app.mcp = McpServers(s.mcp_servers, ping_seconds=app.mcp_ping_seconds, budget=s.tools.budget())
    if s.tools.lark_docs and s.lark_enabled:   # pasted Feishu doc links (offered once Lark is up)
        app.tools.add(LarkDocs(lambda: app.lark_api))
    for server in app.mcp.servers:
        app.tools.add(server)
    await app.mcp.start()


async def stop_tools(app: Any, shutdown: Shutdown) -> None:
    if app.mcp is not None:       # stdio servers end with us (and after SIGKILL: mcp_child.py)
        await app.mcp.stop()


async def start_agent(app: Any, boot: Boot) -> None:
    s = app.settings
    app.agent = Agent(app.memory, boot.model, deadline=s.ethan_reply_deadline,
                      on_failure=app._on_model_failure, on_call=app.metrics.model_calls.inc,
                      tools=app.tools)


async def start_reminders(app: Any, boot: Boot) -> None:
    s = app.settings
    from bot.schedules.reminders import Limits, Reminders
    from bot.schedules.timezones import UserZones
    from bot.schedules.tool import ReminderTools
    from memory.schedules.store import ScheduleStore

    # Due times and reminder leases in the database's time too: a replica whose clock runs
    # ahead would otherwise send a reminder early and take over another's live claim.
    app.schedules = ScheduleStore(app.db, owner=s.replica_id or None, clock=boot.lease_clock)
    app.zones = UserZones(None, boot.profile, s.ethan_timezone)     # Lark's contact API once connected
    app.reminders = Reminders(app.schedules, app.zones, Limits(
        per_user=s.ethan_reminders_per_user, per_chat=s.ethan_reminders_per_chat,
        horizon_days=s.ethan_reminder_horizon_days,
        grace_hours=s.ethan_reminder_grace_hours), wake=lambda: app.scheduler and app.scheduler.wake())
    app.tools.add(ReminderTools(app.reminders))      # schedule_message, list_schedules, cancel_schedule


async def start_commands(app: Any, boot: Boot) -> None:
    s = app.settings
    app.commands = Commands(CommandDeps(memory=app.memory, is_admin=s.is_admin,
                                        bot_open_id=app.bot_open_id, runtime=app._runtime,
                                        reminders=app.reminders))
