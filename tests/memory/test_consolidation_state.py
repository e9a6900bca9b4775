"""memory/consolidation_state.py: the consolidation state machine's tables are complete, and
the queue's code follows them (pure: no database).

- every phase has an action; every phase that claims the session has a next step for every
  outcome, and no other pair is in the table;
- ``phase`` reaches every phase, each from the plan that means it, in the queue's order;
- the queue handles every "next" the table can name (read from its source, so a new entry
  without code fails here);
- ``due_kind``: extract once warm is full (whatever the turns), compress at the threshold.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest

from memory import consolidation_queue
from memory.consolidation_state import (ACTIONS, AFTER, Outcome, Phase, Plan, State, Work, due_kind,
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


def test_the_queue_handles_every_next_the_table_names():
    source = inspect.getsource(consolidation_queue.ConsolidationQueue._after)
    named = {n.what for n in AFTER.values()}
    handled = {w for w in named if f'"{w}"' in source}
    # "finish" and "rederive" are the claimed job's own flow (the steps loop, the episode's end).
    assert named - handled == {"finish", "rederive"}, named - handled


@pytest.mark.parametrize("state, complete, want", [
    (State(warm_turns=20), 0, "extract"),
    (State(warm_turns=20), 15, "extract"),
    (State(warm_turns=19), 15, "compress"),
    (State(warm_turns=19), 14, None),
    (State(), 16, "compress"),
])
def test_due_kind(state, complete, want):
    assert due_kind(state, warm_capacity=20, complete_turns=complete, threshold=15) == want
