"""The wire: a sqlite3.Connection look-alike over one pooled psycopg connection, speaking libpq.

What every unit-of-work function of the stores is given on PostgreSQL (``Connection``): its
statements go to libpq directly, adapted by psycopg's Transformer, prepared per connection from
their second use, pipelined (a unit's BEGIN with its first statement), and every wait for the
server is either ``poll`` in a worker thread or a switch to the event loop's greenlet. With it
the rows and cursors of sqlite3's shape (``Row``, ``Cursor``) and the type adapters. Apart from
the pool and the units of work (storage/postgres/database.py) so that the home-made driver can
be replaced (e.g. by psycopg's own async API) by touching this module only.
"""

from __future__ import annotations

import asyncio
import select
import time
from decimal import Decimal
from typing import Any, Callable, Iterable, Sequence

import greenlet
import psycopg
from psycopg import errors, pq
from psycopg.adapt import Dumper, Loader, PyFormat, Transformer

from storage.port import IntegrityError
from storage.postgres.translate import _native, translate

# A per-key lock held to the end of the unit's transaction. hashtextextended: 64 bits of the
# key's text, so unrelated keys practically never share a lock (and if two did, they would only
# wait for each other, never be wrong).
_SERIALIZE = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))"


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
