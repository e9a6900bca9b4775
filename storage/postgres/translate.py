"""SQLite's dialect rewritten for PostgreSQL: what the stores write, once per distinct statement.

The stores write SQLite's SQL; ``translate`` (psycopg's ``%s`` style) and ``_native`` (libpq's
``$n`` style, what ``Connection.execute`` sends) rewrite the few spellings that differ
(placeholders, ``INSERT OR IGNORE``, ``instr``, negative ``substr``, ``LIKE``'s case rule, ids of
inserted rows). Pure string work with no connection and no driver: apart from the wire
(storage/postgres/wire.py) so that the driver can be replaced without touching the dialect.
"""

from __future__ import annotations

import functools
import re

from storage.schema.postgres import PG_MIGRATIONS

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
