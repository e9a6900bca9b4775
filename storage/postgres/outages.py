"""What a failed connection means: an outage (DatabaseUnavailable, a 503), a refused login, no such database.

The classification of psycopg's errors the engine maps to the port's ``DatabaseUnavailable``
(``_is_outage``), the kind of a failed connect (``connection_kind``) and its one-line message
naming no credential (``_unavailable``). Apart from the pool (storage/postgres/database.py) and
the wire: what start-up, ``ethan db copy`` and the webhook's 503 rely on, whatever the driver.
"""

from __future__ import annotations

import re

import psycopg

from storage.port import DatabaseUnavailable

# SQLSTATEs of a server that is going away or not yet back (admin/crash shutdown, "cannot
# connect now" while it starts or recovers, too many connections) and class 08 (connection).
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


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
