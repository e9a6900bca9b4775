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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, AsyncIterator, Callable, Iterable, Sequence, TypeVar

import greenlet
import psycopg
from psycopg import errors, pq
from psycopg.adapt import Dumper, Loader, PyFormat, Transformer
from psycopg_pool import ConnectionPool

from storage.queueing import PrioritySemaphore
from storage.port import DatabaseError, DatabaseUnavailable, IntegrityError, NotSupported, RetryLater, SchemaTooNew
from storage.schema.postgres import PG_MIGRATIONS

T = TypeVar("T")
MIGRATE_LOCK = 0x45746862    # concurrent `ethan serve` starts migrate one at a time
DEFAULT_POOL = 16
# How long a unit waits for a pooled connection before it is DatabaseUnavailable (a 503 at the
# webhook): under Lark's 3 s with room for the rest of the request, so during an outage Lark
# gets its 503 in time and redelivers, instead of no answer at all.
CHECKOUT_TIMEOUT = 2.5
# Connections are in autocommit mode and transactions are begun by hand, so that BEGIN goes in
# one pipeline with the unit's first statement (psycopg's implicit BEGIN would be a round trip
# of its own), and a one-statement read or write is one round trip (its own implicit transaction).
_BEGIN_WRITE = b"BEGIN"
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# A per-key lock held to the end of the unit's transaction. hashtextextended: 64 bits of the
# key's text, so unrelated keys practically never share a lock (and if two did, they would only
# wait for each other, never be wrong).
_SERIALIZE = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))"
# Lost races PostgreSQL asks the client to replay: serialization_failure, deadlock_detected,
# and lock_not_available — a lock waited for longer than LOCK_TIMEOUT. PostgreSQL sees
# deadlocks among its own locks only; a unit blocked on a row that another replica's
# transaction holds while *it* waits for a free connection slot or thread of its process is a
# cycle no server can see. The lock timeout breaks it: the waiter rolls back (releasing what
# it held) and runs again.
RETRY_STATES = frozenset({"40001", "40P01", "55P03"})
LOCK_TIMEOUT_MS = 2000
RETRIES = 8


# -- rows: sqlite3.Row's shape (by index and by name, dict(row)) ---------------------------
class Row(tuple):
    def __new__(cls, values: Iterable[Any], index: dict[str, int]) -> "Row":
        row = tuple.__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                return tuple.__getitem__(self, self._index[key.lower()])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor):
    names = [c.name for c in cursor.description or ()]
    index = {n: i for i, n in enumerate(names)}
    return lambda values: Row(values, index)


class _NumericLoader(Loader):
    """SUM/AVG give numeric in PostgreSQL; SQLite gives int or float, and so do we."""

    def load(self, data):
        d = Decimal(bytes(data).decode())
        return int(d) if d == d.to_integral_value() else float(d)


class _BoolAsInt(Dumper):
    """Flags are INTEGER 0/1 columns on both engines; Python True goes in as 1."""
    oid = psycopg.adapters.types["int8"].oid
    format = pq.Format.TEXT

    def dump(self, obj):
        return b"1" if obj else b"0"


# -- the dialect ---------------------------------------------------------------------------
_INSERT_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO", re.I)
_NEG_SUBSTR = re.compile(r"substr\(([^,()]+),\s*-(\d+)\)", re.I)
_INSTR = re.compile(r"\binstr\(", re.I)
_LIKE = re.compile(r"\bLIKE\b")
_INSERT_TABLE = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.I)
_AS_REAL = re.compile(r"\bAS\s+REAL\b", re.I)
_IFNULL = re.compile(r"\bIFNULL\(", re.I)
_UNARY_PLUS = re.compile(r"(?<=[\s(])\+(?=[A-Za-z_])")        # SQLite's "don't use this index"
_WHERE_CONST = re.compile(r"\b(WHERE|AND|OR)\s+([01])(?=\s*(?:$|\)|ORDER|GROUP|LIMIT|AND|OR))", re.I)
_JSON_EACH = re.compile(r"([\w.]+)\s+IN\s+\(SELECT value FROM json_each\(\?\)\)", re.I)
_SCALAR_MINMAX = re.compile(r"\b(max|min)\(", re.I)


def _scalar_minmax(sql: str) -> str:
    """SQLite's two-argument max()/min() are PostgreSQL's GREATEST()/LEAST()."""
    out, pos = [], 0
    for m in _SCALAR_MINMAX.finditer(sql):
        depth, i, comma = 1, m.end(), False
        while i < len(sql) and depth:
            c = sql[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "," and depth == 1:
                comma = True
            i += 1
        if comma:
            out.append(sql[pos:m.start()])
            out.append("GREATEST(" if m.group(1).lower() == "max" else "LEAST(")
            pos = m.end()
    out.append(sql[pos:])
    return "".join(out)

# Tables whose ``id`` is an identity column: an INSERT into one returns its id (lastrowid).
IDENTITY_TABLES = frozenset(re.findall(r"CREATE TABLE (\w+) \(\s*id\s+BIGINT GENERATED", "\n".join(PG_MIGRATIONS)))


def _placeholders(sql: str, dollar: bool = False) -> str:
    """``?`` -> ``%s`` outside string literals, a literal ``%`` -> ``%%`` (psycopg's query
    syntax); with ``dollar``, ``?`` -> ``$1, $2, …`` and ``%`` kept (libpq's own syntax)."""
    out: list[str] = []
    quote = ""
    n = 0
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "?":
            n += 1
            out.append(f"${n}" if dollar else "%s")
            continue
        out.append("%%" if ch == "%" and not dollar else ch)
    return "".join(out)


@functools.lru_cache(maxsize=2048)
def _rewrite(sql: str) -> tuple[str, bool]:
    returns_id = False
    if _INSERT_IGNORE.match(sql):
        sql = _INSERT_IGNORE.sub("INSERT INTO", sql, count=1) + " ON CONFLICT DO NOTHING"
    sql = _NEG_SUBSTR.sub(r"right(\1, \2)", sql)
    sql = _INSTR.sub("strpos(", sql)
    sql = _LIKE.sub("ILIKE", sql)
    sql = _AS_REAL.sub("AS DOUBLE PRECISION", sql)
    sql = _IFNULL.sub("COALESCE(", sql)
    sql = _UNARY_PLUS.sub("", sql)
    sql = _WHERE_CONST.sub(lambda m: f"{m.group(1)} {'TRUE' if m.group(2) == '1' else 'FALSE'}", sql)
    # ids in a JSON array parameter (one parameter however many ids): compared as text
    sql = _JSON_EACH.sub(r"(\1)::text IN (SELECT value FROM json_array_elements_text(?::json))", sql)
    sql = _scalar_minmax(sql)
    m = _INSERT_TABLE.match(sql)
    if m and m.group(1).lower() in IDENTITY_TABLES and "RETURNING" not in sql.upper():
        sql = sql.rstrip().rstrip(";") + " RETURNING id"
        returns_id = True
    return sql, returns_id


@functools.lru_cache(maxsize=2048)
def translate(sql: str) -> tuple[str, bool]:
    """SQLite-dialect SQL -> (PostgreSQL SQL in psycopg's ``%s`` style, whether it returns the
    inserted id)."""
    sql, returns_id = _rewrite(sql)
    return _placeholders(sql), returns_id


@functools.lru_cache(maxsize=2048)
def _native(sql: str) -> tuple[bytes, bool]:
    """The same translation in libpq's ``$n`` style, encoded: what ``Connection.execute`` sends."""
    sql, returns_id = _rewrite(sql)
    return _placeholders(sql, dollar=True).encode(), returns_id


class Cursor:
    """The part of sqlite3.Cursor the stores use, over rows already read off the result."""

    __slots__ = ("_rows", "lastrowid", "rowcount")

    def __init__(self, rows: list, rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self):
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self):
        return iter(self.fetchall())

    def close(self) -> None:
        self._rows = []


# A statement is prepared (parsed and planned once per connection) from its second use: the
# stores' statements are a few dozen fixed strings, each run thousands of times; one-off SQL
# (built with a variable number of placeholders, DDL, ANALYZE) runs unnamed. Capped per
# connection so that generated SQL cannot grow the server's memory without bound.
PREPARE_AFTER = 2
MAX_PREPARED = 256
# ``executemany`` on the loop: rows per pipeline (one round trip each), so that a big copy
# (``ethan db copy``) neither holds every statement in libpq's buffer at once nor the loop long.
EXECUTEMANY_BATCH = 500
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY)
_AUTO = PyFormat.AUTO


class _Wire:
    """Per pooled connection: its Transformer (the connection's adapters: our numeric loader
    and bool dumper) and its prepared statements."""

    __slots__ = ("tx", "prepared", "seen", "names", "encoding")

    def __init__(self, raw: psycopg.Connection) -> None:
        self.tx = Transformer(raw)
        self.prepared: dict[tuple, tuple[bytes, dict[str, int] | None]] = {}
        self.seen: dict[tuple, int] = {}
        self.names = 0
        self.encoding = raw.info.encoding


def _raise_for(pgconn: pq.abc.PGconn, res, encoding: str):
    if pgconn.status == pq.ConnStatus.BAD:
        # the server went away mid-statement: psycopg's own path raises OperationalError too
        raise psycopg.OperationalError(pgconn.get_error_message(encoding) or "the connection to the server was lost")
    if res is None:
        raise psycopg.OperationalError("no result from the server")
    err = errors.error_from_result(res, encoding=encoding)
    if isinstance(err, psycopg.errors.IntegrityError):
        raise IntegrityError(str(err)) from err
    raise err


def _sent(pgconn):
    """Everything queued on a nonblocking connection (psycopg's) sent, as steps: while the
    socket is full, wait for it readable or writable, reading input meanwhile, so the server is
    never blocked writing to us while we write to it (libpq's documented loop)."""
    while pgconn.flush():
        yield _WRITE
        pgconn.consume_input()


# What a pipeline's steps (``Connection._pipeline_steps``) wait for between them: the socket
# readable (a reply), or readable-or-writable (the send buffer was full). ``_drive`` does the
# waiting: ``poll`` in a worker thread, or a switch to the event loop (``_switch_to_loop``).
_READ, _WRITE = "read", "write"


def _next_result(pgconn):
    """``PQgetResult`` once it will not block, as steps: waiting for the server is the driver's
    (``poll`` or the event loop), never inside libpq — psycopg's ``get_result`` blocks with the
    GIL held, so a pipeline waiting on a row lock froze the whole process, its event loop and
    the very transaction it waited for (another thread's COMMIT), until the lock timeout
    (tests/memory/test_port.py)."""
    while pgconn.is_busy():
        yield _READ
        pgconn.consume_input()
    return pgconn.get_result()


def _poll(sock: int, step: str) -> None:
    """Wait for ``step`` in this (worker) thread, in ``poll``, without the GIL."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | (select.POLLOUT if step is _WRITE else 0))
    poller.poll()


def _drive(steps, sock: int, wait: Callable[[int, str], None] = _poll):
    """Run a pipeline's steps here, each wait by ``wait``: ``_poll`` in a worker thread, or a
    switch to the event loop's greenlet for a unit run on the loop (``_on_loop``)."""
    try:
        step = next(steps)
        while True:
            wait(sock, step)
            step = steps.send(None)
    except StopIteration as done:
        return done.value


def _result(pgconn, sock: int, wait: Callable[[int, str], None]):
    """What ``PQexec`` returns (the last result of what was sent), waiting by ``wait``."""
    def steps():
        yield from _sent(pgconn)
        last = None
        while True:
            res = yield from _next_result(pgconn)
            if res is None:
                return last
            last = res
    return _drive(steps(), sock, wait)


def _switch_to_loop(sock: int, step: str) -> None:
    """A wait of a unit run on the event loop (``PgDatabase._on_loop``): hand ``(sock, step)``
    to the loop's greenlet, which awaits the socket and switches back."""
    greenlet.getcurrent().parent.switch((sock, step))


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def _ready(sock: int, step: str) -> None:
    """Wait on the loop for what ``step`` waits for: the socket readable, or (``_WRITE``)
    readable or writable."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.add_reader(sock, _wake, fut)
    if step is _WRITE:
        loop.add_writer(sock, _wake, fut)
    try:
        await fut
    finally:
        loop.remove_reader(sock)
        if step is _WRITE:
            loop.remove_writer(sock)


def _pipelined(conn: "Connection", statements: Sequence[tuple[str, Sequence[Any]]]) -> list["Cursor"]:
    """The unit of ``PgDatabase._run_alone``: independent statements in one pipeline."""
    return conn._pipeline(statements)


def _cursor(res, tx: Transformer, returns_id: bool) -> Cursor:
    """A successful result read as a Cursor (a pipeline's; ``execute`` keeps
    its prepared statements' column index instead of building one)."""
    if res.status == pq.ExecStatus.TUPLES_OK:
        n = res.ntuples
        if returns_id:      # text format: the id without loading the row
            return Cursor([], n, int(res.get_value(0, 0).decode()) if n else None)
        rows: list = []
        if n:
            index = {res.fname(i).decode(): i for i in range(res.nfields)}
            tx.set_pgresult(res)
            rows = tx.load_rows(0, n, lambda values: Row(values, index))
        return Cursor(rows, n, None)
    tuples = res.command_tuples
    return Cursor([], -1 if tuples is None else tuples, None)


class Connection:
    """A sqlite3.Connection look-alike over one psycopg connection: what every unit-of-work
    function of the stores is given on this backend.

    Statements go to libpq directly (``exec_prepared`` / ``exec_params``) with psycopg's
    Transformer doing the adaptation both ways — the same dumpers and loaders as a psycopg
    cursor, without the cursor's per-execute Python (query parsing, prepare bookkeeping, result
    objects), which was most of this backend's CPU per message (bench/README.md §11)."""
    dialect = "postgres"

    def __init__(self, raw: psycopg.Connection, begin: bytes | None = None, *, on_loop: bool = False) -> None:
        self.raw = raw
        # In a greenlet of the event loop's (``PgDatabase._on_loop``): every wait for the server
        # is a switch to the loop, never a blocking call (the loop must not block).
        self.on_loop = on_loop
        # The unit's BEGIN and the keys of its advisory locks (``serialize``), sent in one
        # pipeline with its first statement (``_begun``)
        self.begin = begin
        self._locks: list[str] = []
        # A unit's own transaction (``_once``), which ``execute_last`` may end; not the
        # connection of an awaited ``transaction()`` or of a one-statement unit.
        self.owns_tx = begin is not None
        self.ended = False          # ended by ``execute_last``: nothing may run after it
        self.round_trips = 0        # what UnitStats counts (bench/, tests of "n round trips")
        wire = getattr(raw, "_ethan_wire", None)
        if wire is None:
            wire = raw._ethan_wire = _Wire(raw)   # type: ignore[attr-defined]
        self._wire = wire

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if self.ended:
            raise AssertionError("a statement after the unit's execute_last: it would run outside the unit")
        if self.begin is not None:
            return self._begun(sql, params)
        self.round_trips += 1
        query, returns_id = _native(sql)
        wire = self._wire
        tx = wire.tx
        pgconn = self.raw.pgconn
        if params:
            values = tx.dump_sequence(params, [_AUTO] * len(params))
            types, formats = tx.types, tx.formats
        else:
            values, types, formats = None, (), None
        key = (query, types)
        prepared = wire.prepared.get(key)
        exchange = self._exchange
        if prepared is not None:
            res = exchange(pgconn.send_query_prepared, pgconn.exec_prepared, prepared[0], values, formats, 0)
        else:
            seen = wire.seen[key] = wire.seen.get(key, 0) + 1
            if seen >= PREPARE_AFTER and len(wire.prepared) < MAX_PREPARED:
                wire.names += 1
                name = b"ethan_%d" % wire.names
                res = exchange(pgconn.send_prepare, pgconn.prepare, name, query, types or None)
                if res is None or res.status != pq.ExecStatus.COMMAND_OK:
                    _raise_for(pgconn, res, wire.encoding)
                prepared = wire.prepared[key] = (name, None)
                del wire.seen[key]
                res = exchange(pgconn.send_query_prepared, pgconn.exec_prepared, name, values, formats, 0)
            else:
                if len(wire.seen) > 4 * MAX_PREPARED:
                    wire.seen.clear()
                res = exchange(pgconn.send_query_params, pgconn.exec_params, query, values, types or None, formats, 0)
        if res is None:
            _raise_for(pgconn, res, wire.encoding)
        status = res.status
        if status == pq.ExecStatus.TUPLES_OK:
            n = res.ntuples
            if prepared is not None and prepared[1] is not None:
                index = prepared[1]
            else:
                index = {res.fname(i).decode(): i for i in range(res.nfields)}
                if prepared is not None:
                    wire.prepared[key] = (prepared[0], index)
            if n:
                tx.set_pgresult(res)
                rows = tx.load_rows(0, n, lambda values: Row(values, index))
            else:
                rows = []
            if returns_id:
                return Cursor([], n, int(rows[0][0]) if rows else None)
            return Cursor(rows, n, None)
        if status not in _OK:
            _raise_for(pgconn, res, wire.encoding)
        tuples = res.command_tuples
        return Cursor([], -1 if tuples is None else tuples, None)

    def execute_last(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """``port.execute_last``: the unit's last statement, and its transaction's end in the
        same round trip. A unit of this one statement needs no BEGIN at all (a lock taken with
        ``serialize`` goes with it in one message: a simple-protocol message of several
        statements is one implicit transaction); after earlier statements, it and the COMMIT
        go in one pipeline. If it fails, the COMMIT is not run and the unit rolls back as any
        failed unit does."""
        if not self.owns_tx or self.ended:
            return self.execute(sql, params)
        if self.begin is not None:
            # No BEGIN: up to the pipeline's sync its statements are one implicit transaction.
            self.begin, locks, self._locks = None, self._locks, []
            if locks:
                cursor = self._pipeline([*((_SERIALIZE, (k,)) for k in locks), (sql, params)])[-1]
            else:
                cursor = self.execute(sql, params)
            self.ended = True
            return cursor
        cursor = self._pipeline([(sql, params)], commit=True)[0]
        self.ended = True
        return cursor

    def pipelined(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Row]]:
        """Independent statements in one round trip (libpq's pipeline mode): all sent, one sync,
        then every result read. Up to the sync they are one implicit transaction (an error in
        one undoes them all and is raised). Each is prepared from its second use, as in
        ``execute``. Only in a one-statement unit (no BEGIN of its own)."""
        assert self.begin is None, "pipelined() needs a unit without BEGIN"
        return [c.fetchall() for c in self._pipeline(statements)]

    def _pipeline(self, statements: Sequence[tuple[str, Sequence[Any]]], *, commit: bool = False,
                  begin: bytes | None = None) -> list[Cursor]:
        """The statements sent at once, one sync, then every result read: one round trip.
        ``commit``: a COMMIT after them, in the same pipeline (``execute_last``); ``begin``: the
        unit's BEGIN before them (``_begun``)."""
        return _drive(self._pipeline_steps(statements, commit, begin), self.raw.pgconn.socket,
                      _switch_to_loop if self.on_loop else _poll)

    def _pipeline_steps(self, statements: Sequence[tuple[str, Sequence[Any]]], commit: bool,
                        begin: bytes | None = None):
        """``_pipeline`` as steps that yield what they wait for (``_drive``)."""
        if self.ended:
            raise AssertionError("a statement after the unit's execute_last: it would run outside the unit")
        wire, tx, pgconn = self._wire, self._wire.tx, self.raw.pgconn
        bound = []      # everything adapted before anything is sent: only the server can fail below
        for sql, params in statements:
            query, returns_id = _native(sql)
            if params:
                values = tx.dump_sequence(params, [_AUTO] * len(params))
                types, formats = tx.types, tx.formats
            else:
                values, types, formats = None, (), None
            bound.append((query, values, types, formats, returns_id))
        self.round_trips += 1
        sent: list[tuple[tuple, tuple | None, bool, bool]] = []   # (key, prepared entry, preparing now, returns id)
        pgconn.enter_pipeline_mode()
        try:
            if begin is not None:
                pgconn.send_query_params(begin, None, None, None, 0)
            for query, values, types, formats, returns_id in bound:
                key = (query, types)
                prepared = wire.prepared.get(key)
                if prepared is not None:
                    pgconn.send_query_prepared(prepared[0], values, formats, 0)
                    sent.append((key, prepared, False, returns_id))
                    continue
                seen = wire.seen[key] = wire.seen.get(key, 0) + 1
                if seen >= PREPARE_AFTER and len(wire.prepared) < MAX_PREPARED:
                    wire.names += 1
                    name = b"ethan_%d" % wire.names
                    pgconn.send_prepare(name, query, types or None)
                    pgconn.send_query_prepared(name, values, formats, 0)
                    sent.append((key, (name, None), True, returns_id))
                else:
                    pgconn.send_query_params(query, values, types or None, formats, 0)
                    sent.append((key, None, False, returns_id))
            if commit:
                pgconn.send_query_params(b"COMMIT", None, None, None, 0)
            pgconn.pipeline_sync()
            yield from _sent(pgconn)
            out: list[Cursor] = []
            failed = None
            if begin is not None:
                res = yield from _next_result(pgconn)
                yield from _next_result(pgconn)
                if res is None or res.status not in _OK:
                    failed = res
            for key, prepared, preparing, returns_id in sent:
                if preparing:
                    res = yield from _next_result(pgconn)
                    yield from _next_result(pgconn)      # the command's end (NULL)
                    if res is not None and res.status == pq.ExecStatus.COMMAND_OK:
                        wire.prepared[key] = prepared
                        wire.seen.pop(key, None)
                    elif failed is None:
                        failed = res
                res = yield from _next_result(pgconn)
                yield from _next_result(pgconn)
                if res is None or res.status not in _OK:
                    if failed is None:
                        failed = res
                    out.append(Cursor([], -1, None))
                    continue
                out.append(_cursor(res, tx, returns_id))
            if commit:
                res = yield from _next_result(pgconn)
                yield from _next_result(pgconn)
                if failed is None and (res is None or res.status not in _OK):
                    failed = res
            yield from _next_result(pgconn)              # the sync's own result
        except BaseException:
            # Results may be left unread: this connection cannot go back to the pool as it is.
            self.raw.close()
            raise
        pgconn.exit_pipeline_mode()
        if failed is not None:
            if failed.status == pq.ExecStatus.PIPELINE_ABORTED:
                raise psycopg.OperationalError("pipeline aborted")
            _raise_for(pgconn, failed, wire.encoding)
        return out

    def serialize(self, key: str) -> None:
        """Wait for, then hold until this transaction ends, the advisory lock of ``key``
        (``port.serialize``). Taken first in a unit (as it should be), it travels with the
        unit's BEGIN and first statement — one message, one round trip fewer — and its wait is
        part of that statement's; taken later, it is a statement of its own, timed into the
        database's lock-wait counter."""
        if self.begin is not None:
            self._locks.append(key)
            return
        t0 = time.perf_counter()
        self.execute(_SERIALIZE, (key,))
        stats = getattr(self.raw, "_ethan_stats", None)
        if stats is not None:
            stats.add_lock_wait(time.perf_counter() - t0)

    def _begun(self, sql: str, params: Sequence[Any]) -> Cursor:
        """The unit's first statement: its BEGIN, its advisory locks (``serialize``) and it, in
        one pipeline — one round trip, and every one of them prepared (a simple-protocol message
        of the three, its values bound client-side, was parsed and planned each time: 0.55 ms
        of PostgreSQL's CPU per message, the most planning of any statement; bench/README §16).
        A lock's wait is part of this round trip's."""
        begin, self.begin, locks, self._locks = self.begin, None, self._locks, []
        return self._pipeline([*((_SERIALIZE, (k,)) for k in locks), (sql, params)], begin=begin)[-1]

    def _exchange(self, send, exec_, *args):
        """One request and its (last) result: libpq's blocking ``exec_`` form in a worker thread
        (it lets the GIL go while it waits), or on the loop its ``send`` form (same arguments)
        and the waits switched to the loop."""
        if not self.on_loop:
            return exec_(*args)
        send(*args)
        pgconn = self.raw.pgconn
        return _result(pgconn, pgconn.socket, _switch_to_loop)

    def simple(self, command: bytes):
        """``command`` (no parameters: BEGIN, COMMIT, ROLLBACK, a client-side bound statement)
        as one simple-protocol message straight through libpq (psycopg's cursor machinery costs
        more CPU than the round trip itself for these); its last result, raised if it failed."""
        pgconn = self.raw.pgconn
        res = self._exchange(pgconn.send_query, pgconn.exec_, command)
        if res is None or res.status not in _OK:
            _raise_for(pgconn, res, self._wire.encoding)
        return res

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        if self.begin is not None:
            begin, self.begin, locks, self._locks = self.begin, None, self._locks, []
            self.round_trips += 1
            self.simple(begin)
            for k in locks:
                self.execute(_SERIALIZE, (k,))
        if self.on_loop:            # psycopg's cursor would block the loop: our own pipelines
            rows = [tuple(r) for r in rows]
            for i in range(0, len(rows), EXECUTEMANY_BATCH):   # each counts its round trip
                self._pipeline([(sql, r) for r in rows[i:i + EXECUTEMANY_BATCH]])
            return
        self.round_trips += 1       # psycopg pipelines executemany: about one round trip
        q, _ = translate(sql)
        if q.endswith(" RETURNING id") and _:
            q = q[: -len(" RETURNING id")]
        try:
            with self.raw.cursor() as cur:
                cur.executemany(q, [list(r) for r in rows])
        except psycopg.errors.IntegrityError as e:
            raise IntegrityError(str(e)) from e


def _configure(raw: psycopg.Connection) -> None:
    raw.adapters.register_loader("numeric", _NumericLoader)
    raw.adapters.register_dumper(bool, _BoolAsInt)
    raw.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")   # see RETRY_STATES


class AsyncCursor:
    def __init__(self, rows: list, rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self):
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list:
        rows, self._rows = self._rows, []
        return rows

    async def close(self) -> None:
        self._rows = []

    def __aiter__(self):
        return self._iter()

    async def _iter(self):
        for r in await self.fetchall():
            yield r


class AsyncTransaction:
    """What ``Database.transaction()`` yields: aiosqlite's execute/execute_fetchall shape over
    the transaction's pooled connection (each statement one hop to a worker thread)."""
    dialect = "postgres"

    def __init__(self, db: "PgDatabase", conn: Connection) -> None:
        self._db = db
        self.conn = conn

    async def serialize(self, key: str) -> None:
        await self._db._hop(lambda: self.conn.serialize(key))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> AsyncCursor:
        def run():
            cur = self.conn.execute(sql, params)
            return AsyncCursor(cur.fetchall() if not cur.lastrowid else [], cur.rowcount, cur.lastrowid)
        return await self._db._hop(run)

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list:
        return await self._db._hop(lambda: self.conn.execute(sql, params).fetchall())

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        await self._db._hop(lambda: self.conn.executemany(sql, rows))


# SQLSTATEs of a server that is going away or not yet back (admin/crash shutdown, "cannot
# connect now" while it starts or recovers, too many connections) and class 08 (connection).
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def _backoff(attempt: int) -> float:
    """The random pause before replaying a unit that lost a race for the ``attempt``-th time."""
    return random.uniform(0, 0.002 * 2 ** min(attempt, 6))


def _lost_race(e: BaseException) -> bool:
    """A deadlock or serialization failure: nothing is wrong but the timing; run it again."""
    return (getattr(e, "sqlstate", None) or "") in RETRY_STATES


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


def _is_outage(e: BaseException) -> bool:
    """A lost or refused connection, whatever psycopg calls it: ``OperationalError`` (server
    closed the connection, AdminShutdown), ``InterfaceError`` (a connection already closed),
    the pool's timeout — and any error whose SQLSTATE says the server is shutting down or
    starting. Such an error is DatabaseUnavailable (webhook 503, handler retry), not a bug."""
    if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):   # PoolTimeout too
        return True
    state = getattr(e, "sqlstate", None) or ""
    return isinstance(e, psycopg.Error) and (state.startswith("08") or state in _OUTAGE_STATES)


_AUTH = re.compile(r"password authentication failed|no pg_hba\.conf entry|authentication failed|"
                   r"password is required|role \"[^\"]*\" does not exist", re.I)
_MISSING = re.compile(r"database \"[^\"]*\" does not exist", re.I)


def connection_kind(e: BaseException) -> str:
    """``"auth"`` (the server refused the login), ``"missing"`` (no such database) or
    ``"unreachable"`` (no server answered: down, restarting, wrong host or port, a timeout)."""
    state = getattr(e, "sqlstate", None) or ""
    text = str(e)
    if state.startswith("28") or _AUTH.search(text):
        return "auth"
    if state == "3D000" or _MISSING.search(text):
        return "missing"
    return "unreachable"


_SAYS = {"auth": "PostgreSQL refused the login (check the user and password in ETHAN_DATABASE_URL)",
         "missing": "PostgreSQL has no such database (create it, or fix the name in ETHAN_DATABASE_URL)",
         "unreachable": "PostgreSQL is unreachable"}


def _unavailable(e: BaseException) -> DatabaseUnavailable:
    """One line naming the kind of failure. libpq's text names host, port, user and database,
    never the password (the password is handed to it as a parameter, never in a URL it could
    echo: ``connect_params``)."""
    text = str(e).strip()
    kind = connection_kind(e)
    err = DatabaseUnavailable(f"{_SAYS[kind]} ({text.splitlines()[0] if text else type(e).__name__})")
    err.kind = kind    # type: ignore[attr-defined]
    return err


def connect_params(url: str) -> dict[str, Any]:
    """``postgresql://user:password@host:port/db?sslmode=…`` as libpq keyword parameters.

    Parsed here, not by libpq: a password with a raw space (or another character a URL should
    have percent-encoded) made libpq's URI parser fail with the rest of the string — password
    included — in its message, which psycopg's pool then logged at every reconnect attempt."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    params: dict[str, Any] = {}
    if user:
        params["user"] = unquote(user)
    if colon:
        params["password"] = unquote(password)
    host, _, port = hostport.rpartition(":") if hostport.rfind(":") > hostport.rfind("]") else (hostport, "", "")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host:
        params["host"] = unquote(host)
    if port:
        params["port"] = port
    dbname = unquote(parts.path.lstrip("/"))
    if dbname:
        params["dbname"] = dbname
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        params[k] = v
    return params


_ETHANS_OWN = {"connect_timeout": "Ethan sets its own connect timeout (5 s); leave connect_timeout out of the URL"}
_KEY = re.compile(r"^[A-Za-z_]{1,40}$")


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a PostgreSQL URL Ethan connects with, in one line naming no part
    of its userinfo; "" when it can. Checked when the setting is read, so start-up refuses it
    in one line (an unknown query parameter reached psycopg as a keyword and ended start-up
    with a traceback, as did a port urllib cannot read). Values libpq itself checks on connect
    (``sslmode=…``) are left to its one-line error (``_unavailable``)."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(url)
        params = connect_params(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as e:        # an unclosed IPv6 bracket and the like
        return f"not a URL urllib can read ({e})"
    if parts.scheme not in ("postgresql", "postgres"):
        return f"{parts.scheme[:20]!r} is not postgresql://"
    known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
    for key, _ in query:
        if key in _ETHANS_OWN:
            return _ETHANS_OWN[key]
        if key not in known:
            name = repr(key) if _KEY.match(key) else "a parameter"
            return f"{name} in the URL's query is not a PostgreSQL connection parameter (sslmode, application_name, …)"
    port = str(params.get("port", ""))
    if port and not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        # the value is not shown: a URL without its @ puts the password where the port goes
        return "the port is not a number from 1 to 65535"
    return ""


class PgDatabase:
    """The storage port (storage.port.Database) on PostgreSQL."""
    dialect = "postgres"

    def __init__(self, url: str, *, pool_size: int = DEFAULT_POOL, connect_timeout: float = 5.0) -> None:
        self.stats = UnitStats()
        self.url = url
        self.path = url
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._pool: ConnectionPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._tx: dict[asyncio.Task, Connection] = {}   # each open transaction() by its task
        self._slots: PrioritySemaphore | None = None    # see _slot
        self._checking = False                          # a check of idle connections is running

    async def open(self) -> "PgDatabase":
        self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="pg")
        self._slots = PrioritySemaphore(self.pool_size)
        params = connect_params(self.url)
        timeout = max(1, int(self.connect_timeout))
        self._pool = ConnectionPool(
            "", min_size=1, max_size=self.pool_size, open=False, configure=_configure,
            kwargs={**params, "row_factory": _row_factory, "autocommit": True, "connect_timeout": timeout},
            timeout=CHECKOUT_TIMEOUT, name="ethan")
        try:
            # One connection of our own first: its error says what is wrong (the login, the
            # database's name, the server), where the pool's open would only time out.
            await self._hop(lambda: psycopg.connect(**params, connect_timeout=timeout).close())
            await self._hop(lambda: self._pool.open(wait=True, timeout=self.connect_timeout))
            await self._hop(self._migrate)
        except BaseException as e:
            await self.close()
            if isinstance(e, (psycopg.OperationalError, psycopg_pool_timeout())):
                raise _unavailable(e) from e
            raise
        return self

    async def close(self) -> None:
        self._slots = None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(self._executor, pool.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def start_checkpointer(self, interval: float = 0.5) -> None:
        """SQLite's WAL checkpoints have no PostgreSQL counterpart (the server does its own)."""

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    # -- the worker pool -----------------------------------------------------------------
    async def _hop(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise DatabaseError("database is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except psycopg.Error as e:
            unavailable = self._outage(e)
            if unavailable is None:
                raise
            raise unavailable from e

    def _outage(self, e: psycopg.Error) -> DatabaseUnavailable | None:
        """``e`` as the port's DatabaseUnavailable if it says the server is gone (and a check of
        the idle connections started); None for anything else, a lost race included."""
        if _lost_race(e) or not _is_outage(e):
            return None
        self._check_idle()
        return _unavailable(e)

    def _check_idle(self) -> None:
        """One dead connection means the server went away, and a restart killed the idle ones
        too: test those now (the pool drops the dead and reconnects in the background) rather
        than hand each to a later request that then fails. In its own thread: the workers may
        all be busy, and a check against a server still down waits for its connect timeout."""
        pool = self._pool
        if pool is None or self._checking:
            return
        self._checking = True

        def check() -> None:
            try:
                pool.check()
            except Exception:   # noqa: BLE001 - the pool is closing, or the server is still down
                pass
            finally:
                self._checking = False
        threading.Thread(target=check, name="pg-check", daemon=True).start()

    async def _slot(self, first: bool = False) -> float:
        """A pooled connection is checked out only by a unit that holds one of ``pool_size``
        slots, taken here on the event loop: no worker thread ever waits for a connection, so a
        transaction that holds a connection (and maybe a row lock others wait for) always finds
        a thread for its next statement. The slot and the checkout together wait at most
        ``CHECKOUT_TIMEOUT`` (a 503 in time for Lark); returns what is left for the checkout.
        ``first``: ahead of the units already waiting (``write_first``)."""
        if self._slots is None:
            raise DatabaseError("database is not open")
        start = time.monotonic()
        try:
            # Not asyncio.wait_for: on 3.11 a cancel that lands as the slot is granted is
            # swallowed (the caller, e.g. a stopping scheduler, then ran on for 30 s).
            async with asyncio.timeout(CHECKOUT_TIMEOUT):
                await self._slots.acquire(first)
        except TimeoutError:
            raise DatabaseUnavailable(
                f"PostgreSQL is busy: no connection free within {CHECKOUT_TIMEOUT:g} s") from None
        return max(0.05, CHECKOUT_TIMEOUT - (time.monotonic() - start))

    async def _run_unit(self, fn: Callable[..., T], args: tuple, write: bool | None, first: bool = False) -> T:
        """A unit of work on the event loop (``_on_loop``): its function runs in a greenlet of
        the loop's thread, and each of its waits for the server is the loop waiting for the
        socket, as for any other — no worker thread, no hop there and back, no thread switch
        per round trip (bench/README.md §16). Without an idle connection at hand (the pool
        still growing, or a check of it running), it takes the worker path: the pool's
        checkout can block, and the loop must not."""
        slots = self._slots
        left = await self._slot(first)
        try:
            raw = self._idle_connection()
            if raw is None:
                return await self._hop(lambda: self._unit(fn, args, write, left))
            try:
                return await self._on_loop(raw, fn, args, write)
            finally:
                self._pool.putconn(raw)
        finally:
            slots.release()

    async def _on_loop(self, raw: psycopg.Connection, fn: Callable[..., T], args: tuple, write: bool | None) -> T:
        """``_unit`` on the loop: ``fn`` in a greenlet, whose waits (``_switch_to_loop``) come
        here as ``(socket, step)`` and are awaited, then it goes on. A lost race is rolled back
        and replayed, as in ``_unit``. Cancelled mid-way, the connection is closed first (the
        server rolls back; no unread result can reach the next user), then the greenlet is
        unwound."""
        raw._ethan_stats = self.stats   # type: ignore[attr-defined]
        attempt = 0
        while True:
            t0 = time.perf_counter()
            unit = greenlet.greenlet(lambda: self._once(raw, fn, args, write, on_loop=True))
            try:
                wait = unit.switch()
                while not unit.dead:
                    try:
                        await _ready(*wait)
                    except BaseException:
                        raw.close()
                        unit.throw(greenlet.GreenletExit)
                        raise
                    wait = unit.switch()
                return wait
            except psycopg.Error as e:
                if write is not False and _lost_race(e) and attempt < RETRIES:
                    attempt += 1
                    self.stats.add_retry(time.perf_counter() - t0)
                    await asyncio.sleep(_backoff(attempt))
                    continue
                unavailable = self._outage(e)
                if unavailable is None:
                    raise
                raise unavailable from e
            finally:
                self.stats.add_unit(time.perf_counter() - t0)

    async def _run_alone(self, statements: list[tuple[str, Sequence[Any]]]) -> list[Cursor]:
        """A one-statement unit (or independent statements in one pipeline: one implicit
        transaction, one round trip)."""
        return await self._run_unit(_pipelined, (statements,), None)

    def _idle_connection(self) -> psycopg.Connection | None:
        """A pooled connection that is free now, or None; never waits (on the event loop)."""
        pool = self._pool
        if pool is None:
            raise DatabaseError("database is not open")
        if pool.get_stats().get("pool_available", 0) <= 0:
            return None
        try:
            # Free a moment ago; a worker's unit (while the pool is still growing) or the idle
            # check may have taken it since: then wait no more than a blink of the loop.
            return pool.getconn(timeout=0.02)
        except psycopg_pool_timeout():
            return None

    def _unit(self, fn: Callable[..., T], args: tuple, write: bool | None,
              checkout: float = CHECKOUT_TIMEOUT) -> T:
        """``write``: True = a write transaction; False = a read snapshot; None = one statement
        (its own implicit transaction). A write that lost a race (deadlock, serialization
        failure) is rolled back and run again from the start, after a short random pause."""
        assert self._pool is not None
        attempt = 0
        while True:
            t0 = time.perf_counter()
            try:
                with self._pool.connection(timeout=checkout) as raw:
                    raw._ethan_stats = self.stats   # type: ignore[attr-defined]
                    return self._once(raw, fn, args, write)
            except psycopg.Error as e:
                if write is False or not _lost_race(e) or attempt >= RETRIES:
                    raise
                attempt += 1
                self.stats.add_retry(time.perf_counter() - t0)
                time.sleep(_backoff(attempt))
            finally:
                self.stats.add_unit(time.perf_counter() - t0)

    def _once(self, raw: psycopg.Connection, fn: Callable[..., T], args: tuple, write: bool | None,
              on_loop: bool = False) -> T:
        if write is None:
            conn = Connection(raw, on_loop=on_loop)
            try:
                return fn(conn, *args)
            finally:
                self.stats.add_round_trips(conn.round_trips)
        # BEGIN goes with the unit's first statement; a unit that ran none has begun nothing
        # and has nothing to commit.
        conn = Connection(raw, _BEGIN_WRITE if write else _BEGIN_READ, on_loop=on_loop)
        try:
            result = fn(conn, *args)
        except BaseException:
            if conn.begin is None and not conn.ended and not raw.closed:
                conn.round_trips += 1
                with contextlib.suppress(Exception):
                    conn.simple(b"ROLLBACK")
            raise
        else:
            if conn.begin is None and not conn.ended:
                conn.round_trips += 1
                conn.simple(b"COMMIT")
        finally:
            self.stats.add_round_trips(conn.round_trips)
        return result

    def _migrate(self) -> None:
        assert self._pool is not None
        with self._pool.connection() as raw:
            # a concurrent start's migration may take longer than the lock timeout: wait for it
            raw.execute(f"BEGIN; SET LOCAL lock_timeout = 0; SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")
            raw.execute("CREATE TABLE IF NOT EXISTS schema_version"
                        " (version BIGINT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            current = raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            latest = len(PG_MIGRATIONS)
            if current > latest:
                raise SchemaTooNew(
                    f"database has schema version {current}, newer than this Ethan understands "
                    f"({latest}); upgrade Ethan or restore a backup")
            for version in range(current + 1, latest + 1):
                raw.execute(PG_MIGRATIONS[version - 1])
                raw.execute("INSERT INTO schema_version(version, applied_at) VALUES (%s, %s)",
                            (version, time.time()))
            raw.execute("COMMIT")   # releases the migration lock with the transaction

    def _tx_of_task(self) -> Connection | None:
        return self._tx.get(asyncio.current_task()) if self._tx else None

    # -- the port ------------------------------------------------------------------------
    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: fn(conn, *args))
        return await self._run_unit(fn, args, False)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._write(fn, args, False)

    async def write_first(self, fn: Callable[..., T], *args: Any) -> T:
        """``write``, served before the units already waiting for a connection."""
        return await self._write(fn, args, True)

    async def _write(self, fn: Callable[..., T], args: tuple, first: bool) -> T:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: fn(conn, *args))
        return await self._run_unit(fn, args, True, first)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return (await self._write_alone(sql, params)).rowcount

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int((await self._write_alone(sql, params)).lastrowid or 0)

    async def _write_alone(self, sql: str, params: Sequence[Any]) -> Cursor:
        """A one-statement write unit (its own implicit transaction, one round trip, prepared
        from its second use); inside ``transaction()``
        it joins that transaction."""
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: conn.execute(sql, params))
        return (await self._run_alone([(sql, params)]))[0]

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        await self.write(lambda c: c.executemany(sql, rows))

    async def _statement(self, sql: str, params: Sequence[Any]) -> list:
        conn = self._tx_of_task()
        if conn is not None:
            return await self._hop(lambda: conn.execute(sql, params).fetchall())
        return (await self._run_alone([(sql, params)]))[0].fetchall()

    async def fetch_each(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                         write: bool = False) -> list[list]:
        """``port.Database.fetch_each``: one round trip (``Connection.pipelined``)."""
        statements = list(statements)
        conn = self._tx_of_task()
        if conn is not None:       # inside transaction(): its statements, one hop each
            return [await self._hop(lambda sql=sql, params=params: conn.execute(sql, params).fetchall())
                    for sql, params in statements]
        return [c.fetchall() for c in await self._run_alone(statements)]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()):
        rows = await self._statement(sql, params)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list:
        return await self._statement(sql, params)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransaction]:
        """A write transaction holding one pooled connection across awaits. Its body cannot be
        replayed from here: a lost race (deadlock, serialization failure) is ``RetryLater``."""
        assert self._pool is not None
        if self._tx_of_task() is not None:
            raise DatabaseError("nested transaction")
        pool, slots = self._pool, self._slots
        left = await self._slot()
        try:
            async with self._transaction(pool, left) as tx:
                yield tx
        finally:
            slots.release()

    @contextlib.asynccontextmanager
    async def _transaction(self, pool: ConnectionPool, checkout: float) -> AsyncIterator[AsyncTransaction]:
        cm = pool.connection(timeout=checkout)
        raw = await self._hop(cm.__enter__)
        raw._ethan_stats = self.stats   # type: ignore[attr-defined]
        conn = Connection(raw)
        t0 = time.perf_counter()
        try:
            try:
                await self._hop(lambda: conn.simple(_BEGIN_WRITE))
                task = asyncio.current_task()
                self._tx[task] = conn
                try:
                    yield AsyncTransaction(self, conn)
                finally:
                    self._tx.pop(task, None)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._hop(lambda: conn.simple(b"ROLLBACK"))
                await self._hop(lambda: cm.__exit__(None, None, None))
                raise
            else:
                try:
                    await self._hop(lambda: conn.simple(b"COMMIT"))
                finally:
                    await self._hop(lambda: cm.__exit__(None, None, None))
        except psycopg.Error as e:
            if _lost_race(e):
                self.stats.add_retry(0.0)
                raise RetryLater(f"a concurrent write won ({e.sqlstate}); rolled back, retry") from e
            raise
        finally:
            self.stats.add_unit(time.perf_counter() - t0)
            self.stats.add_round_trips(conn.round_trips + 2)    # its BEGIN, its COMMIT or ROLLBACK

    async def schema_version(self) -> int:
        row = await self.fetchone("SELECT MAX(version) AS v FROM schema_version")
        return int(row["v"] or 0)

    async def integrity_check(self) -> str:
        await self.fetchone("SELECT 1")
        return "ok"

    async def table_columns(self) -> dict[str, list[tuple[str, str]]]:
        rows = await self.fetchall(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")
        out: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            out.setdefault(r[0], []).append((r[1], r[2].upper()))
        return out

    async def ping(self) -> None:
        await self.fetchone("SELECT 1")

    async def backup_to(self, dest) -> None:
        """A server's backups are its own tools' (pg_dump, base backups with WAL archiving)."""
        raise NotSupported("ethan backup copies a SQLite file; for PostgreSQL use pg_dump "
                           "(docs/operations.md \"Backups\")")


def psycopg_pool_timeout():
    from psycopg_pool import PoolTimeout
    return PoolTimeout
