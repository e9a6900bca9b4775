"""The delivery spine: "acknowledged means answered, once" (DESIGN.md §7, docs/internals.md).

- ``inbox_store`` — every accepted Lark event committed before it is acknowledged; dedup;
  the leases of rows and conversations (replicas on one database).
- ``outbox_store`` — the card ledger: a crashed card reply is finished, not sent twice.
- ``dispatcher`` — one ordered mailbox per conversation, bounded concurrency.
- ``redelivery`` — retries, user notices and start-up recovery of acknowledged events.
- ``replicas`` — the process's side of the leases: heartbeat, take-over, one process per id.
- ``direct`` — interfaces that wait for their answer (console, terminal, ``/chat``).

The two ``*_store`` modules are the only ones in ``bot/`` holding SQL
(tests/test_storage_contract.py); their tests run on both backends (tests/delivery).
"""
