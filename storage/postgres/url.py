"""ETHAN_DATABASE_URL read for libpq: its keyword parameters, and why a URL cannot be used.

``connect_params`` parses the URL here rather than in libpq (whose parse errors echoed the
password); ``url_problem`` is the one-line refusal the settings' validator and ``ethan db copy
--to`` give. Apart from the engine: checking a URL needs no pool, no wire and no server.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import pq

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
