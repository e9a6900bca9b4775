"""Slash commands at the wire: signed, encrypted webhook events in; answers read back from
the fake Lark Open API; the fake Messages API shows the model was (not) called.

State a test needs before a command (facts, rules, episodes …) is written through the real
memory stores of the running app; conversations are real messages through the webhook.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

from memory.governance.erase import find_user
from memory.profile.modes import COMPANION, WORK
from memory.scope import Scope
from tests.fakes.lark_events import mention
from tests.harness import Harness

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.app_backends]

ADMIN, ALICE, BOB = "ou_admin", "ou_alice", "ou_bob"
ALICE_P2P, BOB_P2P, ADMIN_P2P = "oc_p2p_alice", "oc_p2p_bob", "oc_p2p_admin"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(tmp_path_factory, module_database_url):
    # one app for the module, on its own database: a per-test PostgreSQL database would be
    # swapped under it at the next test (and a restart would open another one)
    async with Harness(tmp_path_factory.mktemp("commands"), ethan_admins=[ADMIN],
                       ethan_database_url=module_database_url) as h:
        h.model.on_tool("write_summary", {"summary": "聊了吉他课和练习计划 guitar practice plan"},
                        keys={"summary"})
        yield h


@pytest_asyncio.fixture(loop_scope="module")
async def h(harness):
    """The shared bot, quiet between tests; each test uses its own chats and users."""
    await harness.idle()
    yield harness
    await harness.idle()


_seq = iter(range(1, 10**9))


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_seq)}_{int(time.time() * 1000) % 100000}"


async def ask(h: Harness, text: str, *, sender: str = ALICE, chat_id: str | None = None,
              chat_type: str = "p2p", mentions: list | None = None, timeout: float = 10.0) -> str:
    """Send one message as Lark would and return the bot's answer to it."""
    if chat_id is None:
        chat_id = {ALICE: ALICE_P2P, BOB: BOB_P2P, ADMIN: ADMIN_P2P}.get(sender, f"oc_p2p_{sender}")
    event = await h.send_text(text, chat_id=chat_id, chat_type=chat_type, sender=sender, mentions=mentions)
    mid = event["event"]["message"]["message_id"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = [m for m in h.lark.messages() if m.reply_to == mid]
        if found:
            await h.idle()
            return h.lark.message(found[-1].message_id).text
        await asyncio.sleep(0.01)
    raise AssertionError(f"no answer to {text!r} within {timeout}s")


def scope(user: str, chat_id: str, *, admin: bool = False) -> Scope:
    return Scope(user_id=user, chat_id=chat_id, chat_type="p2p" if "p2p" in chat_id else "group",
                 message_id=fresh("om_seed"), is_admin=admin)


def chat_requests(h: Harness) -> int:
    return len(h.model.chat_requests())


# -- not a command ------------------------------------------------------------------------

async def test_plain_text_is_not_a_command(h):
    before = chat_requests(h)
    answer = await ask(h, "hello, what is /new for?")
    assert answer.startswith("echo:")
    assert (await ask(h, "/etc/hosts is broken, help")).startswith("echo:")      # a path, not a command
    assert chat_requests(h) == before + 2


# -- help and unknown commands --------------------------------------------------------------

@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_help_and_unknown_commands(h, chat_type):
    chat = ALICE_P2P if chat_type == "p2p" else fresh("oc_group")
    before = chat_requests(h)
    answer = await ask(h, "/help", chat_id=chat, chat_type=chat_type)
    for cmd in ("/help", "/new", "/sessions", "/resume", "/memory", "/forget", "/rules", "/profile",
                "/mode", "/episodes"):
        assert cmd in answer
    assert "/reset" not in answer and "/stats" not in answer        # not for non-admins
    assert await ask(h, "/HeLp", chat_id=chat, chat_type=chat_type) == answer     # case-insensitive
    assert await ask(h, "  ／help", chat_id=chat, chat_type=chat_type) == answer   # full-width slash
    assert await ask(h, "/", chat_id=chat, chat_type=chat_type) == answer
    unknown = await ask(h, "/frobnicate now", chat_id=chat, chat_type=chat_type)
    assert "/frobnicate" in unknown and "/memory" in unknown
    admin_help = await ask(h, "/help", sender=ADMIN, chat_id=chat if chat_type == "group" else ADMIN_P2P,
                           chat_type=chat_type)
    assert "/reset" in admin_help and "/stats" in admin_help
    assert chat_requests(h) == before


async def test_answers_follow_the_users_language(h):
    chat = fresh("oc_p2p_zh")
    assert "Commands" in await ask(h, "/help", sender="ou_zh", chat_id=chat)
    await ask(h, "你好，今天天气不错", sender="ou_zh", chat_id=chat)
    assert "可用命令" in await ask(h, "/help", sender="ou_zh", chat_id=chat)
    assert "已切换" in await ask(h, "/mode 陪伴", sender="ou_zh", chat_id=fresh("oc_p2p_zh"))


# -- sessions --------------------------------------------------------------------------------

@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_new_closes_the_session_writes_its_episode_and_starts_lazily(h, chat_type):
    user = fresh("ou_newbie")
    chat = fresh("oc_p2p_new" if chat_type == "p2p" else "oc_group_new")
    sessions = h.app.memory.sessions
    await ask(h, "I am learning guitar", sender=user, chat_id=chat, chat_type=chat_type)
    await ask(h, "guitar practice plan please", sender=user, chat_id=chat, chat_type=chat_type)
    first = await sessions.active(chat)
    assert first is not None and first.user_turns == 2

    answer = await ask(h, "/new", sender=user, chat_id=chat, chat_type=chat_type)
    assert first.tail in answer
    assert await sessions.active(chat) is None                       # lazily: nothing open yet
    assert (await sessions.get(first.id)).closed_at is not None
    await h.idle()
    [episode] = await h.app.memory.episodes.recent(user)
    assert episode.session_id == first.id

    await ask(h, "a new topic", sender=user, chat_id=chat, chat_type=chat_type)
    second = await sessions.active(chat)
    assert second is not None and second.id != first.id
    # /new with nothing open is fine too
    await ask(h, "/new", sender=user, chat_id=chat, chat_type=chat_type)
    assert "new" in (await ask(h, "/new", sender=user, chat_id=chat, chat_type=chat_type)).lower()


async def make_sessions(h, user: str, chat: str, n: int) -> list:
    """n closed sessions in one conversation, written through the session store."""
    sessions = h.app.memory.sessions
    out = []
    for i in range(n):
        s = scope(user, chat)
        res = await sessions.append_user(s, f"topic number {i}", lark_message_id=s.message_id)
        out.append(res.session)
        await sessions.close_active(chat)
    return out


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_sessions_lists_this_conversation_and_resume_switches(h, chat_type):
    user = fresh("ou_resumer")
    chat = fresh("oc_p2p_res" if chat_type == "p2p" else "oc_group_res")
    other_chat = fresh("oc_p2p_other")
    made = await make_sessions(h, user, chat, 3)
    [elsewhere] = await make_sessions(h, user, other_chat, 1)
    before = chat_requests(h)

    listing = await ask(h, "/sessions", sender=user, chat_id=chat, chat_type=chat_type)
    for s in made:
        assert s.tail in listing and "topic number" in listing
    assert elsewhere.tail not in listing

    answer = await ask(h, f"/resume {made[0].tail}", sender=user, chat_id=chat, chat_type=chat_type)
    assert made[0].tail in answer
    assert (await h.app.memory.sessions.active(chat)).id == made[0].id
    assert "▶ " + made[0].tail in await ask(h, "/sessions", sender=user, chat_id=chat, chat_type=chat_type)
    # the full id works too, and resuming another closes this one
    await ask(h, f"/RESUME {made[1].id}", sender=user, chat_id=chat, chat_type=chat_type)
    assert (await h.app.memory.sessions.active(chat)).id == made[1].id

    unknown = await ask(h, "/resume zzzz", sender=user, chat_id=chat, chat_type=chat_type)
    assert "zzzz" in unknown and "/sessions" in unknown
    assert "/resume <id>" in await ask(h, "/resume", sender=user, chat_id=chat, chat_type=chat_type)
    assert chat_requests(h) == before


async def test_resume_with_an_ambiguous_tail_lists_candidates(h):
    user, chat = fresh("ou_amb"), fresh("oc_p2p_amb")
    made = await make_sessions(h, user, chat, 17)      # 17 tails, 16 hex digits: two share the last
    by_last: dict[str, list] = {}
    for s in made:
        by_last.setdefault(s.id[-1], []).append(s)
    last, group = next((k, v) for k, v in by_last.items() if len(v) > 1)
    answer = await ask(h, f"/resume {last}", sender=user, chat_id=chat)
    for s in group:
        assert s.id in answer
    assert await h.app.memory.sessions.active(chat) is None


# -- memory, forget ---------------------------------------------------------------------------

async def seed_facts(h, user: str, p2p: str, group: str):
    facts = h.app.memory.facts
    private = (await facts.add(scope(user, p2p), f"{user} secretly loves green tea", "preference",
                               source="agent_proactive")).fact
    shared = (await facts.add(scope(user, group), f"{user} works on the billing service", "knowledge",
                              source="consolidator")).fact
    return private, shared


async def test_memory_shows_your_facts_and_hides_private_ones_in_groups(h):
    group = fresh("oc_group_mem")
    alice_private, alice_shared = await seed_facts(h, ALICE, ALICE_P2P, group)
    bob_private, bob_shared = await seed_facts(h, BOB, BOB_P2P, group)
    before = chat_requests(h)

    p2p = await ask(h, "/memory")
    assert f"#{alice_private.id}" in p2p and "green tea" in p2p
    assert f"#{alice_shared.id}" in p2p and "billing" in p2p
    assert "0.95" in p2p and "0.80" in p2p                      # confidence
    assert BOB not in p2p and f"#{bob_shared.id} " not in p2p

    in_group = await ask(h, "/memory", chat_id=group, chat_type="group")
    assert f"#{alice_shared.id}" in in_group
    assert "green tea" not in in_group and f"#{alice_private.id} " not in in_group
    assert BOB not in in_group
    assert chat_requests(h) == before


async def test_forget_deletes_only_your_own_fact(h):
    group = fresh("oc_group_forget")
    alice_private, alice_shared = await seed_facts(h, ALICE, ALICE_P2P, group)
    _, bob_shared = await seed_facts(h, BOB, BOB_P2P, group)
    facts = h.app.memory.facts

    # Bob cannot delete Alice's fact by its id, in p2p or in the group.
    assert "#%d" % alice_shared.id in await ask(h, f"/forget {alice_shared.id}", sender=BOB)
    assert "#%d" % alice_shared.id in await ask(h, f"/forget #{alice_shared.id}", sender=BOB,
                                                chat_id=group, chat_type="group")
    assert await facts.get(ALICE, alice_shared.id) is not None

    # In a group, a private fact is not shown or deleted there.
    refused = await ask(h, f"/forget {alice_private.id}", chat_id=group, chat_type="group")
    assert "green tea" not in refused
    assert await facts.get(ALICE, alice_private.id) is not None

    deleted = await ask(h, f"/forget {alice_shared.id}", chat_id=group, chat_type="group")
    assert "billing" in deleted
    assert await facts.get(ALICE, alice_shared.id) is None
    assert await facts.get(BOB, bob_shared.id) is not None
    assert "#999999" in await ask(h, "/forget 999999")
    assert "/memory" in await ask(h, "/forget banana")
    assert "/forget" in await ask(h, "/forget")


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_forget_all_needs_confirm_and_leaves_others_alone(h, chat_type):
    user, other = fresh("ou_forgetful"), fresh("ou_other")
    p2p, group = fresh("oc_p2p_fa"), fresh("oc_group_fa")
    chat = p2p if chat_type == "p2p" else group
    m = h.app.memory
    for who in (user, other):
        await seed_facts(h, who, p2p, group)
        await m.procedures.add(scope(who, p2p), f"answer {who} in haiku")
        await m.profile.update(scope(who, p2p), "goals", f"{who} wants to ship")
        await m.episodes.write(session_id=fresh("s"), user_id=who, chat_id=p2p, chat_type="p2p",
                               summary="talked about guitar", turn_count=2)

    explain = await ask(h, "/forget all", sender=user, chat_id=chat, chat_type=chat_type)
    assert "/forget all confirm" in explain
    assert len(await m.facts.list(user)) == 2

    done = await ask(h, "/forget ALL Confirm", sender=user, chat_id=chat, chat_type=chat_type)
    assert "2" in done
    assert await m.facts.list(user, include_superseded=True) == []
    assert await m.procedures.list(user) == []
    assert await m.profile.list(user) == []
    assert await m.episodes.recent(user) == []
    assert len(await m.facts.list(other)) == 2 and len(await m.procedures.list(other)) == 1
    assert len(await m.profile.list(other)) == 1 and len(await m.episodes.recent(other)) == 1


# -- rules --------------------------------------------------------------------------------------

async def test_rules_list_and_delete(h):
    group = fresh("oc_group_rules")
    p = h.app.memory.procedures
    mine, _ = await p.add(scope(ALICE, ALICE_P2P), "reply to alice in French")
    bobs, _ = await p.add(scope(BOB, BOB_P2P), "reply to bob in Latin")
    chat_rule, _ = await p.add(scope(ADMIN, group, admin=True), "this group speaks formally", chat_scope=True)

    in_group = await ask(h, "/rules", chat_id=group, chat_type="group")
    assert f"#{mine.id}" in in_group and "French" in in_group
    assert "Latin" not in in_group and "formally" not in in_group          # chat rules: admins only
    admin_view = await ask(h, "/rules", sender=ADMIN, chat_id=group, chat_type="group")
    assert f"#{chat_rule.id}" in admin_view and "formally" in admin_view

    assert f"#{bobs.id}" in await ask(h, f"/rules delete {bobs.id}")        # not yours: not found
    assert len(await p.list(BOB)) == 1
    refused = await ask(h, f"/rules delete {chat_rule.id}", chat_id=group, chat_type="group")
    assert "admin" in refused.lower()
    assert any(r.id == chat_rule.id for r in await p.list(ADMIN, group))
    audit = await h.app.db.fetchall("SELECT * FROM audit WHERE actor = ? AND allowed = 0", (ALICE,))
    assert any("rules" in a["action"] for a in audit)

    assert "French" in await ask(h, f"/rules delete #{mine.id}")
    assert await p.list(ALICE) == []
    assert "/rules delete <id>" in await ask(h, "/rules delete")
    assert "formally" in await ask(h, f"/rules delete {chat_rule.id}", sender=ADMIN, chat_id=group,
                                   chat_type="group")


# -- profile, mode, episodes -------------------------------------------------------------------

async def test_profile_only_in_p2p(h):
    await h.app.memory.profile.update(scope(ALICE, ALICE_P2P), "goals", "ship the billing revamp")
    p2p = await ask(h, "/profile")
    assert "目标与方向" in p2p and "ship the billing revamp" in p2p
    group = await ask(h, "/profile", chat_id=fresh("oc_group_prof"), chat_type="group")
    assert "billing" not in group and "direct" in group
    assert "empty" in await ask(h, "/profile", sender=fresh("ou_blank"), chat_id=fresh("oc_p2p_blank"))


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_mode_switch_persists(h, chat_type):
    user = fresh("ou_moody")
    chat = fresh("oc_p2p_mode" if chat_type == "p2p" else "oc_group_mode")
    modes = h.app.memory.modes
    assert "work" in (await ask(h, "/mode", sender=user, chat_id=chat, chat_type=chat_type)).lower()
    assert "已切换到陪伴" in await ask(h, "/mode 陪伴", sender=user, chat_id=chat, chat_type=chat_type)
    assert await modes.get(user, chat) == COMPANION
    assert await modes.get(user, fresh("oc_elsewhere")) == WORK            # per conversation
    assert "陪伴" in await ask(h, "/mode", sender=user, chat_id=chat, chat_type=chat_type)
    assert "/mode work" in await ask(h, "/mode party", sender=user, chat_id=chat, chat_type=chat_type)
    assert await modes.get(user, chat) == COMPANION
    await ask(h, "/Mode WORK", sender=user, chat_id=chat, chat_type=chat_type)
    assert await modes.get(user, chat) == WORK


async def test_mode_survives_a_restart(h):
    user, chat = fresh("ou_persist"), fresh("oc_p2p_persist")
    await ask(h, "/mode 陪伴", sender=user, chat_id=chat)
    await h.restart()
    assert await h.app.memory.modes.get(user, chat) == COMPANION
    assert "陪伴" in await ask(h, "/mode", sender=user, chat_id=chat)


async def test_episodes_recent_and_search_respect_scope(h):
    user = fresh("ou_epi")
    p2p, group = fresh("oc_p2p_epi"), fresh("oc_group_epi")
    e = h.app.memory.episodes
    await e.write(session_id=fresh("s"), user_id=user, chat_id=p2p, chat_type="p2p",
                  summary="私聊：聊了睡眠问题和焦虑 sleep anxiety", turn_count=3)
    await e.write(session_id=fresh("s"), user_id=user, chat_id=group, chat_type="group",
                  summary="group: planned the release schedule", turn_count=2)
    await e.write(session_id=fresh("s"), user_id=BOB, chat_id=group, chat_type="group",
                  summary="bob's release notes", turn_count=2)

    mine = await ask(h, "/episodes", sender=user, chat_id=p2p)
    # DESIGN.md §4: the group's episode stays in the group (it holds other members' words).
    assert "sleep anxiety" in mine and "release schedule" not in mine and "bob" not in mine
    in_group = await ask(h, "/episodes", sender=user, chat_id=group, chat_type="group")
    assert "release schedule" in in_group and "anxiety" not in in_group
    assert "release schedule" not in await ask(h, "/episodes", sender=user, chat_id=fresh("oc_group_other"),
                                               chat_type="group")
    found = await ask(h, "/episodes release", sender=user, chat_id=group, chat_type="group")
    assert "release schedule" in found and "bob" not in found
    assert "release schedule" not in await ask(h, "/episodes release", sender=user, chat_id=p2p)
    assert "sleep" not in await ask(h, "/episodes anxiety", sender=user, chat_id=group, chat_type="group")
    assert "sleep anxiety" in await ask(h, "/episodes anxiety", sender=user, chat_id=p2p)
    assert "No episodes" in await ask(h, "/episodes", sender=fresh("ou_none"), chat_id=fresh("oc_p2p_none"))


# -- admin --------------------------------------------------------------------------------------

async def audit_rows(h, actor: str) -> list:
    return await h.app.db.fetchall("SELECT * FROM audit WHERE actor = ? ORDER BY id", (actor,))


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_admin_commands_are_refused_and_audited_for_others(h, chat_type):
    user, target = fresh("ou_intruder"), fresh("ou_target")
    chat = fresh("oc_p2p_intr" if chat_type == "p2p" else "oc_group_intr")
    kept = (await h.app.memory.facts.add(scope(target, chat), "target likes jazz", "preference",
                                         source="agent_proactive")).fact
    await ask(h, "keep this context", sender=user, chat_id=chat, chat_type=chat_type)
    session = await h.app.memory.sessions.active(chat)
    before = chat_requests(h)
    for cmd in ("/reset", "/stats", f"/reset user {target} confirm"):
        answer = await ask(h, cmd, sender=user, chat_id=chat, chat_type=chat_type)
        assert "admin" in answer.lower() and "users" not in answer
    assert chat_requests(h) == before
    rows = await audit_rows(h, user)
    assert [(r["action"], r["allowed"]) for r in rows] == [("reset", 0), ("stats", 0), ("reset user", 0)]
    assert all(r["chat_id"] == chat for r in rows)
    assert (await h.app.memory.sessions.active(chat)).id == session.id
    assert await h.app.memory.facts.get(target, kept.id) is not None


@pytest.mark.parametrize("chat_type", ["p2p", "group"])
async def test_admin_reset_closes_the_conversation_without_an_episode(h, chat_type):
    chat = fresh("oc_p2p_rst" if chat_type == "p2p" else "oc_group_rst")
    user = ADMIN if chat_type == "p2p" else fresh("ou_member")
    await ask(h, "first thing about guitar", sender=user, chat_id=chat, chat_type=chat_type)
    await ask(h, "second thing about guitar", sender=user, chat_id=chat, chat_type=chat_type)
    fact = (await h.app.memory.facts.add(scope(user, chat), f"{user} plays guitar", "knowledge",
                                         source="agent_proactive")).fact
    session = await h.app.memory.sessions.active(chat)
    await h.idle()
    requests = len(h.model.requests)

    answer = await ask(h, "/reset", sender=ADMIN, chat_id=chat, chat_type=chat_type)
    assert "reset" in answer.lower()
    assert await h.app.memory.sessions.active(chat) is None
    await h.idle()
    assert await h.app.memory.episodes.recent(user) == []
    assert len(h.model.requests) == requests                # no episode, no final extraction
    await h.restart()                                          # recovery finds nothing due either
    await h.idle()
    assert await h.app.memory.episodes.recent(user) == []
    assert len(h.model.requests) == requests
    assert await h.app.memory.facts.get(user, fact.id) is not None          # facts stay
    [row] = [r for r in await audit_rows(h, ADMIN) if r["action"] == "reset" and r["chat_id"] == chat]
    assert row["allowed"] == 1 and session.id in row["detail"]
    # the next message starts with an empty context (no hot turns replayed)
    await ask(h, "fresh start", sender=user, chat_id=chat, chat_type=chat_type)
    last = h.model.chat_requests()[-1]
    assert not any("guitar" in t for t in h.model.user_texts(last))


async def populate_user(h, victim: str, group: str) -> None:
    p2p = fresh("oc_p2p_victim")
    await ask(h, "my name is Victor and I like chess", sender=victim, chat_id=p2p)
    await ask(h, "remember I moved to Lyon", sender=victim, chat_id=p2p)
    await ask(h, "hello group, Victor here", sender=victim, chat_id=group, chat_type="group")
    await ask(h, "hi Victor, Bob here", sender=BOB, chat_id=group, chat_type="group",
              mentions=[mention(victim, "Victor", key="@_user_1")])
    m = h.app.memory
    await m.facts.add(scope(victim, p2p), "Victor likes chess", "preference", source="agent_proactive")
    await m.facts.add(scope(victim, group), "Victor lives in Lyon", "knowledge", source="consolidator")
    await m.procedures.add(scope(victim, p2p), "call Victor by his first name")
    await m.profile.update(scope(victim, p2p), "identity", "lives in Lyon")
    await m.episodes.write(session_id=fresh("s"), user_id=victim, chat_id=p2p, chat_type="p2p",
                           summary="Victor talked about chess openings", turn_count=2)
    # Bob's episode of the group they both spoke in, as a model would summarise it
    sid = (await h.app.db.fetchone("SELECT session_id FROM messages WHERE content LIKE '%Bob here%'"))["session_id"]
    await m.episodes.write(session_id=sid, user_id=BOB, chat_id=group, chat_type="group",
                           summary="Victor said hello; Bob greeted Victor", turn_count=2,
                           turns=["[Victor] hello group, Victor here", "[Bob] hi Victor, Bob here"])
    await m.modes.set(victim, p2p, COMPANION)


async def test_admin_reset_user_erases_everything_about_them(h):
    victim, group = fresh("ou_victim"), fresh("oc_group_erase")
    await populate_user(h, victim, group)
    bob_messages = await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages WHERE sender_id = ?", (BOB,))
    assert await find_user(h.app.db, victim)
    before = chat_requests(h)
    victim_mention = [mention(victim, "Victor", key="@_user_1")]

    # without confirm: explains, touches nothing
    preview = await ask(h, "/reset user @_user_1", sender=ADMIN, chat_id=group, chat_type="group",
                        mentions=victim_mention)
    assert "confirm" in preview and "@Victor" in preview
    assert len(await h.app.memory.facts.list(victim)) == 2
    # a typed name is not a target
    assert "ou_" in await ask(h, "/reset user @Victor confirm", sender=ADMIN, chat_id=group, chat_type="group")
    assert len(await h.app.memory.facts.list(victim)) == 2

    done = await ask(h, "/reset user @_user_1 confirm", sender=ADMIN, chat_id=group, chat_type="group",
                     mentions=victim_mention)
    assert "Victor" in done
    assert "2 facts, 1 profile entries" in done and "1 of other members' group episodes" in done, done
    [bob_ep] = [e for e in await h.app.memory.episodes.list(BOB) if e.chat_id == group]
    # his words stay (naming her, as he did), hers are gone
    assert bob_ep.summary.startswith("[Bob] ") and "Bob here" in bob_ep.summary
    assert "group, Victor here" not in bob_ep.summary and "said hello" not in bob_ep.summary
    assert chat_requests(h) == before
    await h.idle()
    left = await find_user(h.app.db, victim)
    assert left == {"audit": 1}, left                   # the one place the id remains
    [row] = [r for r in await audit_rows(h, ADMIN) if r["action"] == "reset user" and r["target"] == victim]
    assert row["allowed"] == 1 and row["chat_id"] == group
    after = await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages WHERE sender_id = ?", (BOB,))
    assert after["n"] == bob_messages["n"]
    assert await h.app.memory.sessions.search("chess") == []


async def test_admin_reset_user_by_open_id_in_p2p(h):
    victim, group = fresh("ou_victim"), fresh("oc_group_erase2")
    await populate_user(h, victim, group)
    assert "confirm" in await ask(h, f"/reset user {victim}", sender=ADMIN)
    await ask(h, f"/RESET USER {victim} CONFIRM", sender=ADMIN)
    await h.idle()
    assert await find_user(h.app.db, victim) == {"audit": 1}
    assert "ou_" in await ask(h, "/reset user", sender=ADMIN)


async def test_admin_stats(h):
    answer = await ask(h, "/stats", sender=ADMIN)
    for word in ("users", "conversations", "facts", "queue", "model calls", "failures"):
        assert word in answer
    calls = h.app.agent.calls
    assert f"model calls {calls}" in answer
    assert any(r["action"] == "stats" and r["allowed"] == 1 for r in await audit_rows(h, ADMIN))


# -- no model ------------------------------------------------------------------------------------

async def test_commands_never_call_the_model(h):
    group = fresh("oc_group_quiet")
    before = len(h.model.requests)
    for sender, text, chat, kind in [
        (ALICE, "/help", ALICE_P2P, "p2p"), (ALICE, "/memory", group, "group"),
        (ALICE, "/sessions", ALICE_P2P, "p2p"), (ALICE, "/rules", group, "group"),
        (ALICE, "/profile", ALICE_P2P, "p2p"), (ALICE, "/episodes", group, "group"),
        (ALICE, "/episodes guitar", ALICE_P2P, "p2p"), (ALICE, "/mode", ALICE_P2P, "p2p"),
        (ALICE, "/forget all", ALICE_P2P, "p2p"), (ALICE, "/resume nope", group, "group"),
        (ALICE, "/new", fresh("oc_p2p_empty"), "p2p"), (ADMIN, "/stats", group, "group"),
        (ALICE, "/whatever", ALICE_P2P, "p2p"),
    ]:
        await ask(h, text, sender=sender, chat_id=chat, chat_type=kind)
    assert len(h.model.requests) == before
