"""The agent: one inbound turn in, one reply out, memory read and written on the way.

Order matters and is the contract with the rest of the bot:
1. the user's message is committed (SessionStore.append_user) before the model is called;
2. memory for this scope is gathered according to the path router;
3. the tool loop runs under one overall deadline, streaming into the Reply;
4. only a complete answer is stored; a failure stores nothing and ends in one apology.
Consolidation is requested afterwards and runs off the reply path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from bot.agent.loop import run_loop
from bot.agent.prompt import with_images, MemoryBlocks, build_system, mark_cache, unique_facts, volatile_context, with_context
from bot.agent.router import route
from bot.infra.log import get_logger
from bot.core.reply import Capability, Reply
from bot.core.text import is_chinese
from bot.tools import ToolContext, default_registry
from bot.tools.registry import ToolRegistry
from memory.working.consolidation_queue import ConsolidationQueue
from storage import Database
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from memory.profile.modes import ModeStore
from memory.queries import answer, fetch_together
from memory.procedures import ProcedureStore
from memory.profile.store import ProfileStore
from memory.llm import ChatModel, ModelFailure
from memory.scope import Scope
from memory.sessions.store import SessionStore
from memory.working.view import WorkingMemory

log = get_logger("ethan.agent")


@dataclass(frozen=True, slots=True)
class UserTurn:
    scope: Scope
    text: str
    sender_name: str = ""
    message_id: str | None = None     # the transport's id: a redelivery is recognised by it
    truncated: bool = False
    # Image blocks (memory.llm.ImageBlock) read with this message: sent in this request only;
    # history keeps the text's reference to them (bot/media/attachments.py).
    images: tuple[dict, ...] = ()
    # Untrusted material for this request only (the quoted message, the group's discussion),
    # already fenced as data: in front of the user's words, never stored in history — so
    # consolidation never reads other people's words as the user's.
    material: str = ""
    in_org: bool = False              # the sender is of the bot's organisation (Inbound.sender_in_org)
    # A voice message's transcript, when ``text`` is one: heard by the STT server, not typed —
    # a memory write cannot rest on it alone (bot/tools/base.py own_words).
    heard: str = ""
    # The words the user typed, when ``text`` holds more than them and the fences (attachments'
    # references: a file's name, the transcript); None: ``text`` outside its fences.
    typed: str | None = None


@dataclass
class Memory:
    """The memory layers the agent uses (all share one Database)."""

    db: Database
    sessions: SessionStore
    working: WorkingMemory
    facts: FactStore
    procedures: ProcedureStore
    profile: ProfileStore
    episodes: EpisodeStore
    modes: ModeStore
    queue: ConsolidationQueue | None = None   # None = no background consolidation


@dataclass(frozen=True)
class AgentResult:
    text: str
    ok: bool
    session_id: str
    blocks: MemoryBlocks
    failure: str = ""
    iterations: int = 0
    tools: tuple[dict, ...] = ()
    usage: dict = field(default_factory=dict)   # input/output/cache_read/cache_write tokens, all calls
    replayed: bool = False
    # Answered earlier together with this message: the reply to that message carried it and
    # nothing was sent here (a caller that waits for its answer hears it: bot/core/handler.py).
    answered_with: str = ""
    model: str = ""          # the model that answered (a fallback, maybe)
    provider: str = ""


APOLOGIES = {
    "zh": {
        "spend_limit": "抱歉，我现在无法回答：模型的用量额度已用完，我已通知管理员。你的消息已保存。",
        "auth": "抱歉，我现在无法回答：机器人的模型配置有误（API 密钥被拒绝），重试也没有用，需要管理员修正配置。你的消息已保存。",
        "not_found": "抱歉，我现在无法回答：机器人的模型配置有误（模型名称或接口地址不存在），重试也没有用，需要管理员修正配置。你的消息已保存。",
        "default": "抱歉，我这边暂时出了点问题，没能回答。你的消息已保存，请稍后再发一次。",
    },
    "en": {
        "spend_limit": "Sorry — I can't answer right now: the model's usage limit has been reached and the admins have been told. Your message is saved.",
        "auth": "Sorry — I can't answer: this bot is misconfigured (its model's API key was refused). Retrying won't help; an admin has to fix the configuration. Your message is saved.",
        "not_found": "Sorry — I can't answer: this bot is misconfigured (its model name or API address is not known to the provider). Retrying won't help; an admin has to fix the configuration. Your message is saved.",
        "default": "Sorry — something went wrong on my side and I couldn't answer. Your message is saved; please try again in a moment.",
    },
}
TRUNCATION_NOTE = {
    "zh": "（你的消息太长，我只读了前 {n} 个字符。）",
    "en": "(Your message was very long; I read only the first {n} characters.)",
}


def apology(kind: str, user_text: str) -> str:
    lang = "zh" if is_chinese(user_text) else "en"
    table = APOLOGIES[lang]
    return table.get(kind, table["default"])


def _read_together(turns: list, message_id: str | None) -> tuple[str, ...]:
    """The other messages this turn's answer answers: the unanswered turns at the end of the
    session, read merged with its own message (stored, their turns failed before an answer)."""
    out: list[str] = []
    for t in reversed(turns):
        if t.answered:
            break
        if t.user is not None and t.user.lark_message_id and t.user.lark_message_id != message_id:
            out.append(t.user.lark_message_id)
    return tuple(out)


class Agent:
    def __init__(self, memory: Memory, model: ChatModel, *, deadline: float = 60.0,
                 max_input_chars: int = 20_000,
                 on_failure: Callable[[str, str], None] | None = None,
                 on_call: Callable[[], None] | None = None,
                 tools: ToolRegistry | None = None) -> None:
        self.memory = memory
        self.tools = tools or default_registry()   # the tool port (bot/tools/registry.py)
        self.model = model
        self.deadline = deadline
        self.max_input_chars = max_input_chars
        self.on_failure = on_failure     # called with ModelFailure.kind and .detail (metrics, /healthz)
        self.on_call = on_call           # called once per turn sent to the model (metrics)
        self.calls = 0
        self.failures = 0

    async def gather(self, scope: Scope, text: str, *, session_id: str, mode: str | None = None,
                     view: Any = None) -> MemoryBlocks:
        """Everything memory contributes to this request, per the path router. ``view``: the
        session's ContextView when the caller already has it (read with the context); ``mode``
        None: read with the rest. The mode, the rules, the profile and the facts are one round
        trip (memory/queries.py)."""
        m = self.memory
        path = route(text)
        reads = [m.procedures.for_request_query(scope),
                 m.profile.for_prompt_query(scope) if path.profile else answer(""),
                 m.facts.top_read(scope, k=path.fact_limit),
                 m.modes.get_query(scope.user_id, scope.conv_key) if mode is None else answer(mode)]
        procedures, profile, top, mode = await fetch_together(m.db, reads)
        rules = tuple(p.rule for p in procedures)
        facts = unique_facts(top)
        episodes: tuple = ()
        if path.episodes:
            episodes = tuple(await m.episodes.recall(scope, text, exclude_session=session_id))
        if view is None:
            view = await m.working.view(session_id)
        return MemoryBlocks(path=path.name, mode=mode, rules=rules, profile=profile, facts=facts,
                            episodes=episodes, long_term=view.long_term, summary=view.summary,
                            hot_turns=len(view.hot_turns))

    async def respond(self, turn: UserTurn, reply: Reply) -> AgentResult:
        m, scope = self.memory, turn.scope
        started = time.monotonic()
        deadline = started + self.deadline
        model_name = getattr(self.model, "name", "")
        appended = await m.sessions.append_user(
            scope, turn.text, sender_name=turn.sender_name, model=model_name,
            lark_message_id=turn.message_id)
        session = appended.session
        if appended.closed is not None and m.queue is not None:
            m.queue.request_episode(appended.closed)
        bound = log.bind(chat_id=scope.chat_id, message_id=turn.message_id or "",
                         session_id=session.id, user_id=scope.user_id)

        # What this turn reads last: its own message, merged with the unanswered ones before it.
        current, upto, speaker = turn.text, appended.message.id, turn.sender_name or scope.user_id
        if appended.duplicate:
            # Re-delivered after a fault: never ask the model twice for one message.
            stored = await m.sessions.answer_of(appended.message)
            if stored.answer is not None and stored.own:
                # Its answer was produced: send it again (same uuid, so Lark shows it once).
                await reply.finish(stored.answer.content)
                bound.info("agent.replayed")
                return AgentResult(stored.answer.content, True, session.id, MemoryBlocks(), replayed=True)
            if stored.answer is not None:
                # A later message's turn read this one too and answered both (issue 45 N14): the
                # reply to that message carries the answer; nothing more is sent for this one.
                bound.info("agent.answered_together", answered_with=stored.answer.lark_message_id or "",
                           answer_id=stored.answer.id)
                return AgentResult(stored.answer.content, True, session.id, MemoryBlocks(), replayed=True,
                                   answered_with=stored.answer.lark_message_id or "?")
            if stored.later:
                # Later messages' turns stored them and failed too: this answer is stored after
                # them, so it reads them as well (an answer covers what is before it).
                last = stored.later[-1]
                current, upto, speaker = last.content, last.id, last.sender_name or last.sender_id

        await reply.working()
        # The request's messages and the memory panel's view come from one read of the
        # working memory (one SQLite round trip, one consistent snapshot).
        messages, view = await m.working.context_and_view(
            session.id, current, before_message_id=upto, speaker_name=speaker)
        blocks = await self.gather(scope, turn.text, session_id=session.id, view=view)
        offers = reply.capabilities
        panel = Capability.MEMORY_PANEL in offers      # the console's memory panel, /chat's memory
        if panel:
            reply.show_memory(blocks)
        # Stable first, volatile last (prompt.py): the episodes and the date ride in front of
        # the user's words, after every cached part; breakpoints where the prefix is cacheable.
        system = build_system(blocks)
        context = volatile_context(blocks, today=dt.date.today().isoformat())
        if turn.material:     # after the date, still in front of the user's words
            context = f"{context}\n\n{turn.material}" if context else turn.material
        replayed = messages          # with the current input last; the helpers below copy, never edit
        messages = with_context(messages, context)
        if turn.images:
            messages = with_images(messages, turn.images)
        ctx = ToolContext(scope=scope, facts=m.facts, procedures=m.procedures, profile=m.profile,
                          user_text=turn.text, session_id=session.id,
                          confirm=reply.confirm_tool if Capability.CONFIRM_TOOL in offers else None,
                          material=turn.material or "", in_org=turn.in_org, heard=turn.heard, typed=turn.typed,
                          history=replayed,
                          carried=frozenset({"image"}) if turn.images else frozenset())
        offer = self.tools.offer(ctx)
        system, messages = mark_cache(system, messages, offer.spec_dicts, model=model_name)
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        try:
            result = await run_loop(self.model, system=system, messages=messages,
                                    registry=self.tools, offer=offer, ctx=ctx, on_text=reply.stream, deadline=deadline)
        except ModelFailure as failure:
            self.failures += 1
            if self.on_failure is not None:
                self.on_failure(failure.kind, failure.detail)
            (bound.error if failure.kind == "spend_limit" else bound.warning)(
                "agent.model_failed", kind=failure.kind, status=failure.status,
                detail=failure.detail[:300], elapsed_ms=int((time.monotonic() - started) * 1000))
            text = apology(failure.kind, turn.text)
            if Capability.FAILURE_STATUS in offers:     # /chat answers 503, not 200 + apology
                reply.note_failure(failure.kind)
            await reply.finish(text)
            return AgentResult(text, False, session.id, blocks, failure=failure.kind)

        text = result.text or ("（没有内容）" if is_chinese(turn.text) else "(no answer)")
        if turn.truncated:
            lang = "zh" if is_chinese(turn.text) else "en"
            text += "\n\n" + TRUNCATION_NOTE[lang].format(n=self.max_input_chars)
        # The tool round trips, neutral (memory/llm.py), with the answer they led to: shown by
        # `ethan session show`; a resumed session replays the answers' text only, on any provider.
        calls = [b for content, results in result.rounds
                 for b in (*(c for c in content if c.get("type") == "tool_use"), *results)]
        await m.sessions.append_assistant(session.id, text, tool_calls=calls or None, reply_to=turn.message_id,
                                          together=_read_together(view.hot_turns, turn.message_id))
        usage = dataclasses.asdict(result.usage)
        tools = tuple({"name": o.name, "is_error": o.is_error, "result": o.content}
                      for o in result.tool_outcomes)
        if Capability.TOOL_PANEL in offers:          # the console's memory panel
            reply.show_tools(list(tools))
        if panel and any(usage.values()):
            # the panel again, now with what the cache served: cached / written / uncached input
            reply.show_memory(dataclasses.replace(blocks, usage=usage))
        await reply.finish(text)
        if m.queue is not None:
            m.queue.request(session.id)
        bound.info("agent.replied", path=blocks.path, iterations=result.iterations,
                   tools=[t["name"] for t in tools], chars=len(text), model=result.model,
                   provider=result.provider, input_tokens=usage["input_tokens"],
                   cache_read_tokens=usage["cache_read_tokens"], cache_write_tokens=usage["cache_write_tokens"],
                   elapsed_ms=int((time.monotonic() - started) * 1000))
        return AgentResult(text, True, session.id, blocks, iterations=result.iterations,
                           tools=tools, usage=usage, model=result.model, provider=result.provider)
