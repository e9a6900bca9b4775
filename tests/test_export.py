"""`ethan memory export` / `import` (memory/governance/export.py, export_format.py, import_check.py,
import_.py): the spec's file layout, validation, all-or-nothing, idempotence, and a lossless round
trip through a fresh database."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storage import Database, database as open_target_db
from tests.conftest import BACKENDS


async def open_target(target):
    return await open_target_db(target).open()
from memory.episodes.store import EpisodeStore
from memory.governance.export import collect, export_user
from memory.governance.export_format import FILES, MANIFEST, SCHEDULES, ImportRefused
from memory.governance.import_ import import_user
from memory.governance.import_check import read_bundle
from memory.facts.store import FactStore
from memory.procedures import ProcedureStore
from memory.profile.store import ProfileStore
from memory.scope import Scope

ALICE = "ou_alice"
BOB = "ou_bob"
A_P2P = Scope(user_id=ALICE, chat_id="oc_alice_dm", chat_type="p2p", message_id="om_a1")
A_GROUP = Scope(user_id=ALICE, chat_id="oc_team", chat_type="group", message_id="om_g1", is_admin=True)
B_P2P = Scope(user_id=BOB, chat_id="oc_bob_dm", chat_type="p2p", message_id="om_b1")

SPEC_FACT_FIELDS = {"content", "category", "confidence", "source", "created_at", "last_accessed", "hit_count"}
SPEC_EPISODE_FIELDS = {"session_id", "summary", "timestamp", "model", "turn_count", "keywords"}
TABLES = ("facts", "procedures", "profile_entries", "episodes")


class Clock:
    def __init__(self, t: float = 1_780_000_000.25) -> None:
        self.t = t

    def __call__(self) -> float:
        self.t += 1.125
        return self.t


async def fill(db: Database) -> None:
    """Every kind of memory for Alice (with history and provenance), and some for Bob."""
    clock = Clock()
    facts = FactStore(db, clock=clock)
    await facts.add(B_P2P, "用户喜欢咖啡", "preference", source="agent_proactive")    # ids are not refs
    await facts.add(A_P2P, "用户喜欢乌龙茶", "preference", source="agent_proactive")
    await facts.add(A_P2P, "用户住在北京", "knowledge", source="consolidator", user_text="记住我住在北京")
    await facts.add(A_P2P, "用户住在上海", "correction", source="consolidator")       # supersedes 北京
    await facts.add(A_GROUP, "User prefers short answers", "preference", source="consolidator")
    await facts.add(A_GROUP, "User prefers short answers", "preference", source="consolidator")  # reinforced
    await facts.add(Scope(user_id=ALICE, chat_id="", chat_type="p2p"), "用户的猫叫年糕", "knowledge",
                    source="user_edit")
    procs = ProcedureStore(db, clock=clock)
    await procs.add(A_P2P, "回复都用中文", "用户明确要求")
    await procs.add(A_GROUP, "No emoji", "")
    await procs.add(A_GROUP, "本群用英文讨论", "", chat_scope=True)                  # the chat's: not exported
    await procs.add(B_P2P, "Always answer in English")
    profile = ProfileStore(db, clock=clock)
    await profile.update(A_P2P, "基础特征", "名字叫林一，30 岁")
    await profile.update(A_GROUP, "目标与方向", "2026 年底前完成独立产品上线")
    await profile.update(A_P2P, "心理与情绪", "压力大时喜欢散步", "merge", source="consolidator")
    await profile.update(A_P2P, "目标与方向", "学会做 <b>手冲</b> 咖啡")             # angle brackets neutralised
    await profile.update(B_P2P, "基础特征", "Bob, 41")
    episodes = EpisodeStore(db, clock=clock)
    await episodes.write(session_id="s_20260612_0151_b18c", user_id=ALICE, chat_id="oc_alice_dm", chat_type="p2p",
                         summary="林一聊了乌龙茶和搬家到上海的计划", turn_count=4, model="claude-haiku-4-5",
                         turns=["我最近喜欢喝乌龙茶", "下个月要搬到上海", "新家在静安寺附近", "房东养了一只柯基"],
                         started_at=1_781_000_000.0, ended_at=1_781_003_600.0)
    await episodes.write(session_id="s_20260613_0900_aa01", user_id=ALICE, chat_id="oc_team", chat_type="group",
                         summary="团队讨论了发布计划", turn_count=2, keywords=["发布", "计划", "release"])
    await episodes.write(session_id="s_20260613_0901_bb02", user_id=BOB, chat_id="oc_bob_dm", chat_type="p2p",
                         summary="Bob asked about coffee beans", turn_count=3)


async def counts(db: Database) -> dict[str, int]:
    out = {}
    for t in TABLES:
        row = await db.fetchone(f"SELECT COUNT(*) AS n FROM {t}")
        out[t] = row["n"]
    return out


def read_files(d: Path) -> dict[str, bytes]:
    return {name: (d / name).read_bytes() for name in (*FILES, MANIFEST)}


@pytest.fixture
async def filled(db):
    await fill(db)
    return db


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Export and import are part of the store contract: on both backends."""
    return request.param


@pytest.fixture
async def fresh(tmp_path, backend, request):
    target = request.getfixturevalue("pg_cluster").new_database() if backend == "postgres" else tmp_path / "fresh.db"
    database = await open_target(target)
    try:
        yield database
    finally:
        await database.close()


# -- export ----------------------------------------------------------------------------

async def test_export_writes_the_spec_layout_for_one_user(filled, tmp_path):
    out = tmp_path / "export"
    result = await export_user(filled, ALICE, out)
    assert sorted(p.name for p in result.files) == sorted((*FILES, SCHEDULES, MANIFEST))
    assert result.counts == {"facts": 5, "procedures": 2, "profile_entries": 4, "episodes": 2}

    facts = json.loads((out / "facts.json").read_text(encoding="utf-8"))
    assert all(SPEC_FACT_FIELDS <= set(f) for f in facts)
    assert all({"visibility", "chat_id", "message_id", "superseded_at", "superseded_by"} <= set(f) for f in facts)
    by_content = {f["content"]: f for f in facts}
    assert set(by_content) == {"用户喜欢乌龙茶", "用户住在北京", "用户住在上海", "User prefers short answers",
                               "用户的猫叫年糕"}                  # not Bob's 咖啡
    beijing, shanghai = by_content["用户住在北京"], by_content["用户住在上海"]
    assert beijing["superseded_at"] is not None and beijing["superseded_by"] == shanghai["ref"]
    assert by_content["User prefers short answers"]["hit_count"] == 1
    assert by_content["User prefers short answers"]["visibility"] == "shared"
    assert by_content["用户喜欢乌龙茶"]["confidence"] == 0.95
    assert by_content["用户喜欢乌龙茶"]["source"] == "agent_proactive"
    assert by_content["用户喜欢乌龙茶"]["visibility"] == "private"
    assert [f["ref"] for f in facts] == list(range(1, len(facts) + 1))

    rules = json.loads((out / "procedures.json").read_text(encoding="utf-8"))
    assert [r["rule"] for r in rules] == ["回复都用中文", "No emoji"]     # the chat's rule is the chat's
    assert rules[0]["context"] == "用户明确要求"

    profile = (out / "user_profile.md").read_text(encoding="utf-8")
    assert profile.startswith("# 用户画像\n\n## 基础特征\n- 名字叫林一，30 岁\n")
    assert "## 目标与方向\n- 2026 年底前完成独立产品上线\n- 学会做 ＜b＞手冲＜/b＞ 咖啡\n" in profile
    assert "## 心理与情绪\n- 压力大时喜欢散步" in profile
    assert "Bob" not in profile and "## 身份与背景" not in profile      # empty sections left out

    episodes = json.loads((out / "episodes.json").read_text(encoding="utf-8"))
    assert [e["session_id"] for e in episodes] == ["s_20260612_0151_b18c", "s_20260613_0900_aa01"]
    assert all(SPEC_EPISODE_FIELDS <= set(e) for e in episodes)
    assert episodes[1]["keywords"] == ["发布", "计划", "release"]
    assert episodes[0]["visibility"] == "private" and episodes[1]["visibility"] == "shared"

    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["user_id"] == ALICE and manifest["version"] == 1
    meta = {m["entry"]: m for m in manifest["profile_entries"]}
    assert meta["压力大时喜欢散步"]["source"] == "consolidator"
    assert meta["2026 年底前完成独立产品上线"]["visibility"] == "shared"
    assert meta["名字叫林一，30 岁"]["visibility"] == "private"

    raw = (out / "facts.json").read_text(encoding="utf-8")
    assert "乌龙茶" in raw and "\\u" not in raw and raw.startswith("[\n  {\n    \"ref\": 1,")   # UTF-8, pretty


async def test_export_is_deterministic_and_an_unknown_user_exports_empty_files(filled, tmp_path):
    assert await collect(filled, ALICE) == await collect(filled, ALICE)
    result = await export_user(filled, "ou_nobody", tmp_path / "empty")
    assert result.counts == {"facts": 0, "procedures": 0, "profile_entries": 0, "episodes": 0}
    assert (tmp_path / "empty" / "facts.json").read_text() == "[]\n"
    assert (tmp_path / "empty" / "user_profile.md").read_text() == ""


# -- round trip ----------------------------------------------------------------------------

async def test_round_trip_through_a_fresh_database_is_lossless(filled, fresh, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    await export_user(filled, ALICE, first)
    result = await import_user(fresh, ALICE, first)
    assert result.added == {"facts": 5, "procedures": 2, "profile_entries": 4, "episodes": 2}
    assert result.missing == []
    await export_user(fresh, ALICE, second)
    assert read_files(first) == read_files(second)

    # What was imported behaves like memory, not just like files: injection, recall, rules.
    top = await FactStore(fresh).top(A_P2P, touch=False)
    assert "用户住在上海" in [f.content for f in top] and "用户住在北京" not in [f.content for f in top]
    group_top = await FactStore(fresh).top(A_GROUP, touch=False)
    assert {f.content for f in group_top} == {"User prefers short answers", "用户的猫叫年糕"}  # privacy kept
    assert "心理与情绪" not in await ProfileStore(fresh).for_prompt(A_GROUP)
    assert "名字叫林一" not in await ProfileStore(fresh).for_prompt(A_GROUP)     # private entry stays private
    found = await EpisodeStore(fresh).search(ALICE, "乌龙茶")
    assert [e.session_id for e in found] == ["s_20260612_0151_b18c"]
    assert [p.rule for p in await ProcedureStore(fresh).for_request(A_P2P)] == ["回复都用中文", "No emoji"]


async def test_importing_twice_adds_nothing_the_second_time(filled, fresh, tmp_path):
    first, again = tmp_path / "one", tmp_path / "again"
    await export_user(filled, ALICE, first)
    await import_user(fresh, ALICE, first)
    before = await counts(fresh)
    second = await import_user(fresh, ALICE, first)
    assert second.added == {"facts": 0, "procedures": 0, "profile_entries": 0, "episodes": 0}
    assert second.unchanged == {"facts": 5, "procedures": 2, "profile_entries": 4, "episodes": 2}
    assert await counts(fresh) == before
    await export_user(fresh, ALICE, again)
    assert read_files(first) == read_files(again)
    # Into the database it came from: all already there.
    back = await import_user(filled, ALICE, first)
    assert sum(back.added.values()) == 0


async def test_import_merges_with_what_is_there_and_may_change_owner(filled, fresh, tmp_path):
    out = tmp_path / "one"
    await export_user(filled, ALICE, out)
    carol = Scope(user_id="ou_carol", chat_id="oc_carol_dm", chat_type="p2p")
    await FactStore(fresh).add(carol, "用户喜欢乌龙茶", "preference", source="consolidator")   # known already
    await ProfileStore(fresh).update(carol, "基础特征", "名字叫林一，30 岁")
    result = await import_user(fresh, "ou_carol", out)
    assert result.exported_user == ALICE
    assert result.added["facts"] == 4 and result.unchanged["facts"] == 1   # 乌龙茶 known already
    assert result.added["profile_entries"] == 3 and result.unchanged["profile_entries"] == 1
    assert await FactStore(fresh).count("ou_carol") == 4              # 乌龙茶 once, 上海, short answers, 猫
    assert await FactStore(fresh).count(ALICE) == 0


async def test_a_directory_with_only_some_files_imports_those(filled, fresh, tmp_path):
    out = tmp_path / "one"
    await export_user(filled, ALICE, out)
    (out / "facts.json").unlink()
    (out / MANIFEST).unlink()
    result = await import_user(fresh, ALICE, out)
    assert result.missing == ["facts.json"]
    assert result.added["facts"] == 0 and result.added["episodes"] == 2
    entries = await ProfileStore(fresh).list(ALICE)
    assert {e.source for e in entries} == {"user_edit"} and {e.visibility for e in entries} == {"shared"}


# -- refusing bad files ----------------------------------------------------------------------

def _edit_json(name: str, fn):
    def apply(d: Path) -> None:
        data = json.loads((d / name).read_text(encoding="utf-8"))
        fn(data)
        (d / name).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return apply


def _write(name: str, text: str | bytes):
    def apply(d: Path) -> None:
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return apply


def _set(i: int, key: str, value):
    def fn(data):
        data[i][key] = value
    return fn


BAD = [
    ("fact category", _edit_json("facts.json", _set(0, "category", "bogus")), "facts.json: fact 1: category"),
    ("fact confidence", _edit_json("facts.json", _set(1, "confidence", 1.5)), "facts.json: fact 2: confidence"),
    ("fact missing content", _edit_json("facts.json", lambda d: d[2].pop("content")),
     "facts.json: fact 3: content: missing"),
    ("fact unknown field", _edit_json("facts.json", _set(0, "colour", "red")), "facts.json: fact 1: colour: unknown field"),
    ("fact secret", _edit_json("facts.json", _set(0, "content", "my api key is sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAAAAAAAA")),
     "facts.json: fact 1: content: refused"),
    ("fact dangling supersede", _edit_json("facts.json", _set(1, "superseded_by", 99)),
     "facts.json: fact 2: superseded_by: no fact has ref 99"),
    ("fact duplicate ref", _edit_json("facts.json", _set(1, "ref", 1)), "facts.json: fact 2: ref"),
    ("fact string time", _edit_json("facts.json", _set(0, "created_at", "yesterday")), "facts.json: fact 1: created_at"),
    ("facts not a list", _write("facts.json", '{"content": "x"}'), "facts.json: expected a JSON array"),
    ("facts not json", _write("facts.json", '[{"content": '), "facts.json: not valid JSON (line 1"),
    ("facts NaN", _edit_json("facts.json", _set(0, "confidence", float("nan"))), "facts.json: not valid JSON"),
    ("facts not utf-8", _write("facts.json", "[]".encode() + "乌龙".encode("gbk")), "facts.json: not UTF-8"),
    ("rule two lines", _edit_json("procedures.json", _set(0, "rule", "a\nb")), "procedures.json: rule 1: rule"),
    ("rule duplicate", _edit_json("procedures.json", lambda d: d.append(dict(d[0]))),
     "procedures.json: rule 3: the same rule as rule 1"),
    ("profile unknown section", _write("user_profile.md", "# 用户画像\n\n## 爱好\n- 喝茶\n"),
     "user_profile.md: line 3: unknown section"),
    ("profile not a bullet", _write("user_profile.md", "## 基础特征\n喝茶\n"), "user_profile.md: line 2"),
    ("episode no session", _edit_json("episodes.json", _set(1, "session_id", "")), "episodes.json: episode 2: session_id"),
    ("episode keywords", _edit_json("episodes.json", _set(0, "keywords", "tea")), "episodes.json: episode 1: keywords"),
    ("episode duplicate session", _edit_json("episodes.json", _set(1, "session_id", "s_20260612_0151_b18c")),
     "episodes.json: episode 2: session_id"),
    ("manifest newer", _edit_json(MANIFEST, lambda d: d.update(version=7)), "manifest.json: version 7 is newer"),
    ("manifest provenance", _edit_json(MANIFEST, lambda d: d["profile_entries"][0].update(source="robot")),
     "manifest.json: profile_entries[0].source"),
]


@pytest.mark.parametrize("name, breaks, expected", BAD, ids=[b[0] for b in BAD])
async def test_bad_files_are_refused_naming_file_and_field_and_nothing_is_written(
        filled, fresh, tmp_path, name, breaks, expected):
    out = tmp_path / "one"
    await export_user(filled, ALICE, out)
    breaks(out)
    before = await counts(fresh)
    with pytest.raises(ImportRefused) as e:
        await import_user(fresh, ALICE, out)
    assert expected in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and "sk-ant" not in str(e.value)      # one line; a secret is never echoed
    assert await counts(fresh) == before == {t: 0 for t in TABLES}


async def test_a_refusal_discovered_while_writing_rolls_everything_back(filled, fresh, tmp_path):
    out = tmp_path / "one"
    await export_user(filled, ALICE, out)
    procs = ProcedureStore(fresh, max_rules=100)
    for i in range(49):                                  # 49 + 2 imported > 50 rules for one user
        await procs.add(A_P2P, f"规则 {i} 号：每次回复前先确认第 {i} 件事")
    before = await counts(fresh)
    with pytest.raises(ImportRefused, match="procedures.json: ou_alice would have 51 rules"):
        await import_user(fresh, ALICE, out)
    assert await counts(fresh) == before                 # the facts written before it are gone too


async def test_an_empty_or_missing_directory_is_refused(tmp_path, fresh):
    with pytest.raises(ImportRefused, match="not a directory"):
        await import_user(fresh, ALICE, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImportRefused, match="nothing to import"):
        read_bundle(tmp_path / "empty")


async def test_hand_written_spec_files_import_with_defaults(fresh, tmp_path):
    """Files with only the spec's fields (no refs, no provenance, no manifest) import."""
    d = tmp_path / "spec"
    d.mkdir()
    (d / "facts.json").write_text(json.dumps([
        {"content": "用户是后端工程师", "category": "knowledge", "confidence": 0.8, "source": "consolidator",
         "created_at": 1749744812.3, "last_accessed": 1749744812.3, "hit_count": 0},
    ], ensure_ascii=False), encoding="utf-8")
    (d / "episodes.json").write_text(json.dumps([
        {"session_id": "s_20260612_0151_b18c", "summary": "你好，我是张三，今天是来测试 多轮记忆能力...",
         "timestamp": 1749744812.3, "model": "gemini-2.5-flash-lite", "turn_count": 18,
         "keywords": ["张三", "测试", "记忆", "科幻", "苹果"]},
    ], ensure_ascii=False), encoding="utf-8")
    result = await import_user(fresh, ALICE, d)
    assert result.added["facts"] == 1 and result.added["episodes"] == 1
    assert sorted(result.missing) == ["procedures.json", "user_profile.md"]
    [fact] = await FactStore(fresh).list(ALICE)
    assert fact.visibility == "private"                  # unknown origin: the private default
    [ep] = await EpisodeStore(fresh).search(ALICE, "科幻")
    assert ep.turn_count == 18 and ep.visibility == "private" and ep.keywords[0] == "张三"


async def test_export_overwrites_an_earlier_export_in_place(filled, tmp_path):
    out = tmp_path / "one"
    await export_user(filled, ALICE, out)
    (out / "notes.txt").write_text("mine")
    await FactStore(filled).add(A_P2P, "用户养了一只狗", "knowledge", source="user_edit")
    await export_user(filled, ALICE, out)
    assert "用户养了一只狗" in (out / "facts.json").read_text(encoding="utf-8")
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    shutil.rmtree(out)


async def test_episodes_carry_their_turns_and_dates_and_long_text_is_accepted(filled, fresh, tmp_path):
    out = tmp_path / "turns"
    await export_user(filled, ALICE, out)
    episodes = json.loads((out / "episodes.json").read_text())
    first = next(e for e in episodes if e["session_id"] == "s_20260612_0151_b18c")
    assert first["turns"][-1] == "房东养了一只柯基" and len(first["turns"]) == 4
    assert first["started_at"] == 1_781_000_000.0 and first["ended_at"] == 1_781_003_600.0
    first["summary"] = "很长的总结。" * 2000        # 12 000 characters: cut to what the store keeps, not refused
    (out / "episodes.json").write_text(json.dumps(episodes, ensure_ascii=False))
    await import_user(fresh, ALICE, out)
    found = await EpisodeStore(fresh).search(ALICE, "柯基")      # said in the turns only
    assert [e.session_id for e in found] == ["s_20260612_0151_b18c"]
    assert found[0].started_at == 1_781_000_000.0 and len(found[0].summary) <= 4000


async def test_active_reminders_travel_with_the_export_and_are_imported_once(filled, fresh, tmp_path):
    import time as _time

    from memory.schedules.store import ScheduleStore

    store = ScheduleStore(filled)
    soon = _time.strftime("%Y-%m-%dT%H:%M", _time.localtime(_time.time() + 86400))
    await store.add(owner_id=ALICE, chat_id="oc_a", chat_type="p2p", text="给客户回电话", tz="Asia/Shanghai",
                    dtstart=soon)
    weekly = await store.add(owner_id=ALICE, chat_id="oc_g", chat_type="group", text="weekly report",
                             tz="Europe/Berlin", dtstart="2026-03-02T10:00", rrule="FREQ=WEEKLY;BYDAY=MO")
    gone = await store.add(owner_id=ALICE, chat_id="oc_a", chat_type="p2p", text="cancelled", tz="UTC", dtstart=soon)
    await store.cancel(gone.id, owner_id=ALICE)
    await store.add(owner_id="ou_other", chat_id="oc_o", chat_type="p2p", text="not Alice's", tz="UTC", dtstart=soon)
    out = tmp_path / "out"
    await export_user(filled, ALICE, out)
    exported = json.loads((out / SCHEDULES).read_text())
    assert sorted(r["text"] for r in exported) == ["weekly report", "给客户回电话"]
    result = await import_user(fresh, ALICE, out)
    assert (result.added["schedules"], result.unchanged["schedules"]) == (2, 0)
    again = await import_user(fresh, ALICE, out)
    assert (again.added["schedules"], again.unchanged["schedules"]) == (0, 2)
    imported = {j.text: j for j in await ScheduleStore(fresh).for_owner(ALICE)}
    assert set(imported) == {"weekly report", "给客户回电话"}
    assert imported["weekly report"].next_due == weekly.next_due or imported["weekly report"].next_due > _time.time()
    _edit = out / SCHEDULES
    _edit.write_text(json.dumps([{**exported[0], "rrule": "FREQ=SOMETIMES"}]))
    with pytest.raises(ImportRefused, match="schedules.json: reminder 1"):
        await import_user(fresh, ALICE, out)
