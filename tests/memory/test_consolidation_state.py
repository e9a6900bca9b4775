"""memory/working/consolidation_state.py: the consolidation state machine's tables are complete, and
the queue's code follows them (pure: no database).

- every phase has an action; every phase that claims the session has a next step for every
  outcome, and no other pair is in the table;
- ``phase`` reaches every phase, each from the plan that means it, in the queue's order;
- the queue has a method for every work ``ACTIONS`` names (``consolidation_queue.WORK``: every
  phase, the ones that claim and the ones that end a job) and for every next ``AFTER`` names
  (``consolidation_queue.NEXT``), called the way the queue calls them — and no method for a
  name the tables no longer use;
- ``due_kind``: extract once warm is full (whatever the turns), compress at the threshold.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest

from memory.working import consolidation_queue
from memory.working.consolidation_state import (ACTIONS, AFTER, Outcome, Phase, Plan, State, Work, due_kind,
                                        phase)


@dataclass(frozen=True)
class Meta:
    closed_at: float | None = None


NOW = 1_800_000_000.0
OPEN = Meta()
WRITE = [(1, "fact", "ou_a", {})]
PLANS = {
    Phase.BACKING_OFF: Plan(State(failures=1, next_attempt_at=NOW + 30), OPEN, WRITE, None),
    Phase.GONE: Plan(State(), None, [], None),
    Phase.PENDING_WRITES: Plan(State(), Meta(closed_at=NOW), WRITE, Work("s", "compress", 0, 9, 5)),
    Phase.EPISODE: Plan(State(), Meta(closed_at=NOW), [], None),
    Phase.EXTRACT: Plan(State(warm_turns=20), OPEN, [], Work("s", "extract", 0, 40, 20)),
    Phase.COMPRESS: Plan(State(), OPEN, [], Work("s", "compress", 0, 9, 5)),
    Phase.SETTLED: Plan(State(), OPEN, [], None),
}


def test_every_phase_has_an_action_and_every_claimed_phase_every_outcome():
    assert set(ACTIONS) == set(Phase)
    claimed = {p for p, a in ACTIONS.items() if a.claims}
    assert set(AFTER) == {(p, o) for p in claimed for o in Outcome}


@pytest.mark.parametrize("expected", list(Phase), ids=lambda p: p.value)
def test_phase_reaches_every_phase(expected):
    assert phase(PLANS[expected], NOW) is expected


def test_a_backoff_ends_at_next_attempt_at():
    plan = PLANS[Phase.BACKING_OFF]
    assert phase(plan, plan.state.next_attempt_at) is Phase.PENDING_WRITES


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)[:3]


def test_the_queue_has_a_method_for_every_work_the_table_names():
    work = consolidation_queue.WORK
    named = {a.work for a in ACTIONS.values()}
    assert named == set(work), {"no method": named - set(work), "not in ACTIONS": set(work) - named}
    for name, fn in work.items():       # awaited as WORK[name](queue, session_id, plan)
        assert inspect.iscoroutinefunction(fn) and _params(fn) == ["self", "sid", "plan"], name


def test_the_queue_has_a_method_for_every_next_the_table_names():
    nexts = consolidation_queue.NEXT
    named = {n.what for n in AFTER.values()}
    assert named == set(nexts), {"no method": named - set(nexts), "not in AFTER": set(nexts) - named}
    for name, fn in nexts.items():      # awaited as NEXT[name](queue, session_id, error) -> go on?
        assert inspect.iscoroutinefunction(fn) and _params(fn) == ["self", "sid", "error"], name


@pytest.mark.parametrize("state, complete, want", [
    (State(warm_turns=20), 0, "extract"),
    (State(warm_turns=20), 15, "extract"),
    (State(warm_turns=19), 15, "compress"),
    (State(warm_turns=19), 14, None),
    (State(), 16, "compress"),
])
def test_due_kind(state, complete, want):
    assert due_kind(state, warm_capacity=20, complete_turns=complete, threshold=15) == want
