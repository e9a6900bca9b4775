"""UnitStats: the PostgreSQL engine's counters (units, round trips, lock waits, replays).

Read by the benchmark (bench/bench_scale.py) and by bot/infra/metrics.py; updated by the pool's
units (storage/postgres/database.py) and the wire's ``serialize``. Apart: a counter set with a
lock, no SQL and no driver.
"""

from __future__ import annotations

import threading

class UnitStats:
    """Counters the benchmark reads (bench/bench_scale.py): time in units, time waiting for
    per-key locks, replays. Updated from the worker threads; a lock keeps the sums whole."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.units = 0
        self.round_trips = 0
        self.unit_seconds = 0.0
        self.lock_wait_seconds = 0.0
        self.retries = 0
        self.retry_seconds = 0.0

    def add_unit(self, seconds: float) -> None:
        with self._lock:
            self.units += 1
            self.unit_seconds += seconds

    def add_round_trips(self, n: int) -> None:
        with self._lock:
            self.round_trips += n

    def add_lock_wait(self, seconds: float) -> None:
        with self._lock:
            self.lock_wait_seconds += seconds

    def add_retry(self, seconds: float) -> None:
        with self._lock:
            self.retries += 1
            self.retry_seconds += seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {"units": self.units, "round_trips": self.round_trips, "unit_seconds": self.unit_seconds,
                    "lock_wait_seconds": self.lock_wait_seconds, "retries": self.retries,
                    "retry_seconds": self.retry_seconds}
