"""The store contract under concurrency, on PostgreSQL (issue 29): with no lock shared by every
writer, many tasks of one process and two processes (two replicas' pools) write the same user's
facts, profile and episode, one conversation's session and messages, one inbox event and one
consolidation counter — and the end state is exactly the serial run's: no duplicate fact,
episode, message or inbox row, no lost update (docs/internals.md "Concurrency, per store";
each break in docs/reliability.md)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from storage import database
from tests.concurrency import workload
from tests.concurrency.workload import end_state, run
from tests.test_storage_contract import ROOT

TASKS = 12


@pytest.fixture
def backend() -> str:
    return "postgres"


async def _serial(pg_cluster, tags_and_tasks: list[tuple[str, int]]) -> dict:
    db = await database(pg_cluster.new_database()).open()
    try:
        for tag, n in tags_and_tasks:
            for i in range(n):
                await workload.one_task(db, tag, i)
        return await end_state(db)
    finally:
        await db.close()


def _expected_shape(state: dict, total: int) -> None:
    assert len(state["facts"]) == total + 1                         # no duplicate fact
    assert (workload.FACT, total - 1) in state["facts"]              # reinforced by every other add
    assert state["sessions"] == [1]                                  # one session for the conversation
    assert state["messages"].count("同一条消息") == 1                 # one row per Lark message
    assert len(state["messages"]) == total + 1
    assert state["inbox"].count("ev_same") == 1 and len(state["inbox"]) == total + 1
    assert state["profile"] == [workload.ENTRY]
    assert state["episodes"] == [1]
    assert state["failures"] == [total]                              # no lost increment


async def test_many_tasks_leave_the_serial_end_state(db, pg_cluster):
    await run(db, "a", TASKS)
    state = await end_state(db)
    _expected_shape(state, TASKS)
    assert state == await _serial(pg_cluster, [("a", TASKS)])


async def test_two_processes_and_many_tasks_leave_the_serial_end_state(db, db_target, pg_cluster):
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.concurrency.workload", str(db_target), "b", str(TASKS), cwd=ROOT,
        stderr=subprocess.PIPE)
    await run(db, "a", TASKS)
    _, err = await asyncio.wait_for(other.communicate(), 120)
    assert other.returncode == 0, err.decode()[-2000:]
    state = await end_state(db)
    _expected_shape(state, 2 * TASKS)
    assert state == await _serial(pg_cluster, [("a", TASKS), ("b", TASKS)])
