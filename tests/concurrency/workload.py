"""One replica's share of the concurrency contract's workload (tests/concurrency): the same
users, conversations, facts, episodes and inbox events as every other task and process.

``python -m tests.concurrency.workload URL TAG TASKS`` runs it as another process (another
replica, its own pool) against the same PostgreSQL database; the tests run it in-process too.
Every operation is about shared keys, so any unit that is not safe under concurrency shows up
as a duplicate row or a lost update in ``end_state``."""

from __future__ import annotations

import asyncio
import sys

from memory.working.consolidation_store import ConsolidationStore
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from bot.delivery.inbox_store import Inbox
from memory.profile.store import IDENTITY, ProfileStore
from memory.scope import Scope
from memory.sessions.store import SessionStore
from storage import Database, database

USER = "ou_shared"
P2P = Scope(USER, "oc_shared_p2p", "p2p", message_id="om_fact")
GROUP = Scope(USER, "oc_shared_group", "group")
FACT = "用户喜欢喝手冲咖啡"
ENTRY = "在杭州做后端工程师"
SUMMARY = "用户和 Ethan 讨论了杭州的咖啡馆，决定周末去试一家新的手冲店。"


async def one_task(db: Database, tag: str, i: int) -> None:
    """One task's operations, each on a key every other task also writes."""
    facts, sessions, profile = FactStore(db), SessionStore(db, idle_timeout=10 ** 9), ProfileStore(db)
    inbox = Inbox(db, owner=f"replica-{tag}", conversations=True)
    await facts.add(P2P, FACT, "preference", source="consolidator")                  # one fact, reinforced
    await facts.add(P2P, f"用户的第{tag}{i}号收藏是一只编号{tag}{i}的杯子", "knowledge", source="consolidator")
    stored = await sessions.append_user(GROUP, f"消息 {tag} {i}", lark_message_id=f"om_{tag}_{i}")
    session_id = stored.session.id                 # the conversation's one session
    await sessions.append_user(GROUP, "同一条消息", lark_message_id="om_same")       # stored once
    await inbox.accept(event_id="ev_same", message_id="om_same_ev", chat_id=GROUP.chat_id,
                       conv_key=GROUP.conv_key, create_time=1.0, payload="{}")    # one inbox row
    await inbox.accept(event_id=f"ev_{tag}_{i}", message_id=f"om_ev_{tag}_{i}", chat_id=GROUP.chat_id,
                       conv_key=GROUP.conv_key, create_time=1.0, payload="{}")
    await profile.update(P2P, IDENTITY, ENTRY, "append", source="agent_proactive")    # one entry
    await EpisodeStore(db).write(session_id=session_id, user_id=USER, chat_id=P2P.chat_id, chat_type="p2p",
                                 summary=SUMMARY, turn_count=6, keywords=["咖啡", "杭州"])  # one episode
    await ConsolidationStore(db).record_failure(session_id, f"e{tag}{i}", base=1, cap_s=1)    # a counter


async def run(db: Database, tag: str, tasks: int) -> None:
    await asyncio.gather(*(one_task(db, tag, i) for i in range(tasks)))


async def end_state(db: Database) -> dict:
    """What the workload leaves, independent of timing (ids and times left out)."""
    q = db.fetchall
    return {
        "facts": sorted((r["content"], r["hit_count"]) for r in await q(
            "SELECT content, hit_count FROM facts WHERE user_id = ? AND superseded_at IS NULL", (USER,))),
        "sessions": [r["n"] for r in await q(
            "SELECT COUNT(*) AS n FROM sessions WHERE conv_key = ? GROUP BY conv_key", (GROUP.conv_key,))],
        "messages": sorted(r["content"] for r in await q(
            "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.conv_key = ?",
            (GROUP.conv_key,))),
        "inbox": sorted(r["event_id"] for r in await q("SELECT event_id FROM inbox")),
        "profile": sorted(r["entry"] for r in await q(
            "SELECT entry FROM profile_entries WHERE user_id = ?", (USER,))),
        "episodes": [r["n"] for r in await q("SELECT COUNT(*) AS n FROM episodes WHERE user_id = ?", (USER,))],
        "failures": [r["failures"] for r in await q("SELECT failures FROM consolidation_state")],
    }


async def _main(url: str, tag: str, tasks: int) -> None:
    db = await database(url, pool_size=4).open()
    try:
        await run(db, tag, tasks)
    finally:
        await db.close()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
