"""Leases: which replica works a row right now (DESIGN.md §7, docs/reliability.md "Replicas").

A replica is named by ``ETHAN_REPLICA_ID`` (default ``<hostname>:<pid>``). The inbox's rows and
conversations (bot/delivery/inbox_store.py), consolidation jobs (memory/consolidation_queue.py)
and reminders (memory/schedules.py) are each held by one owner until a ``lease_until`` its
heartbeat renews.
"""

from __future__ import annotations

import os
import socket


def default_replica_id() -> str:
    """``<hostname>:<pid>``: unique per process on a host, and a restarted process is a new
    replica (its predecessor's leases expire; nothing waits for a pid to come back)."""
    return f"{socket.gethostname()}:{os.getpid()}"
