"""The PostgreSQL engine of the storage port (storage/port.py).

Why psycopg 3 with sync connections (and not asyncpg): every store's unit of work is one plain
function over a DB-API connection (``fn(conn, *args)``), run today in SQLite's own thread.
psycopg's sync connection is a DB-API connection, so the very same functions run here, one
pooled connection per unit of work, with no second async implementation of each store. asyncpg
would need every unit rewritten as coroutines (and its own placeholder style).

Where a unit runs: on the event loop, in a greenlet of the loop's thread (``_on_loop``). Each of
its waits for the server (``Connection`` sends nonblocking, then ``_switch_to_loop``) is a
switch back to the loop, which awaits the socket as any other and switches back: the unit's
code stays plain sync code, and there is no hop to a worker thread and back per unit, nor a
thread switch and a wait for the interpreter lock per round trip (bench/README.md §16). The
worker threads remain for what may block: a unit when no pooled connection is idle (the pool's
checkout blocks), the statements of an awaited ``transaction()``, opening and migrating.

The SQL the stores write is SQLite's dialect; ``translate`` rewrites the few spellings that
differ (placeholders, ``INSERT OR IGNORE``, ``instr``, negative ``substr``, ``LIKE``'s case
rule, ids of inserted rows) once per distinct statement. What cannot be rewritten mechanically
(search) asks ``conn.dialect`` and has a branch per engine in its store.

Guarantees: there is no lock shared by every writer (issue 29). A write unit is one READ
COMMITTED transaction; what keeps each store's writes right is the store's own means — unique
constraints and ``ON CONFLICT``, conditional UPDATEs (a claim changes a row only while its
WHERE still holds, re-checked by PostgreSQL on the newest row version), row locks
(``port.for_update``) on rows a unit reads and then changes, and a per-key advisory lock
(``port.serialize``: one user's memory, one conversation, one session) only where a unit must
see a whole set unchanged while it decides (docs/internals.md "Concurrency, per store"). A
deadlock or serialization failure (40P01, 40001) rolls the unit back and runs ``fn`` again, at
most ``RETRIES`` times; inside an awaited ``transaction()`` it cannot be replayed and surfaces
as ``RetryLater`` (a database error: the delivery layer retries the step). Read units run
concurrently, each in one REPEATABLE READ snapshot (SQLite's read transaction).

The wire (what bench/README.md §11 measured): statements go to libpq directly, adapted by
psycopg's own Transformer, prepared per connection from their second use; a unit's BEGIN
travels in one pipeline with its first statement, so a unit of n statements is n + 1 round
trips (its COMMIT the last) and a one-statement write or read is one.

The package, by job: ``database.py`` (``PgDatabase``: the pool, units of work, transactions,
retries), ``wire.py`` (the libpq-level ``Connection``, its cursors, prepared statements and
pipelines: the driver), ``translate.py`` (SQLite's dialect rewritten), ``outages.py`` (what a
failed connection means), ``url.py`` (ETHAN_DATABASE_URL as libpq parameters) and ``stats.py``
(the counters). ``PgDatabase`` is its public face (storage/__init__.py opens it).
"""

from storage.postgres.database import PgDatabase  # noqa: F401
