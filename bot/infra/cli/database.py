"""``ethan db copy`` and ``ethan backup``: the database as a whole, for an operator.

``db copy`` copies the SQLite database into PostgreSQL (safe to run again, counts verified);
``backup`` makes a consistent, integrity-checked copy of the SQLite file (on PostgreSQL it
says to use pg_dump). Apart from the other subcommands: they move whole databases, not one
user's or one session's rows.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bot.infra.cli.runner import EXIT_FAIL, EXIT_OK, CliError, _database_name, _open
from bot.infra.config import Settings

# --------------------------------------------------------------------------------------
# ethan db copy
# --------------------------------------------------------------------------------------

async def _db_copy(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.copy import copy_database
    from storage import database, is_database_url
    from storage.sqlite import SqliteDatabase

    if not is_database_url(args.to):
        raise CliError(f"ethan: --to {args.to!r}: not a postgresql:// URL")
    from storage.postgres.url import url_problem
    if problem := url_problem(args.to):         # one line naming no credential, as for ETHAN_DATABASE_URL
        raise CliError(f"ethan: --to: {problem}")
    if not settings.db_path.exists():
        raise CliError(f"ethan: no database at {settings.db_path} to copy", EXIT_FAIL)
    source = await SqliteDatabase(settings.db_path).open()
    try:
        target = await database(args.to).open()
        try:
            result = await copy_database(source, target)
        finally:
            await target.close()
    finally:
        await source.close()
    total = sum(result.counts.values())
    new = sum(result.copied.values())
    print(f"copied {settings.db_path} to PostgreSQL: {new} new rows, {total} rows in all, counts verified")
    for t, n in result.counts.items():
        print(f"  {t:<22} {n:>8}  (+{result.copied.get(t, 0)})")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# ethan backup
# --------------------------------------------------------------------------------------

async def _backup(settings: Settings, args: argparse.Namespace) -> int:
    from storage import is_database_url
    from storage.sqlite import check_file

    if is_database_url(settings.database_target):
        # SQLite's online backup API has no PostgreSQL counterpart here: the server's own
        # tool makes the consistent copy (docs/operations.md "Backup and restore").
        raise CliError(f"ethan: backup copies a SQLite file; this is {_database_name(settings)}: "
                       'use pg_dump -Fc "$ETHAN_DATABASE_URL" > ethan.dump (docs/operations.md)')

    target = Path(args.path).expanduser()
    if target.is_dir() or args.path.endswith(("/", os.sep)):
        target.mkdir(parents=True, exist_ok=True)
        target = target / time.strftime("ethan-%Y%m%d-%H%M%S.db")
    source = settings.db_path
    if target.exists():
        if target.resolve() == source.resolve():
            raise CliError("ethan: the backup cannot replace the database itself")
        if not args.force:
            raise CliError(f"ethan: {target} exists (use --force to replace it)")
    db = await _open(settings)
    part = target.with_name(target.name + ".part")
    try:
        await db.backup_to(part)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        await db.close()
    check = check_file(part)
    if check != "ok":
        part.unlink(missing_ok=True)
        raise CliError(f"ethan: the copy failed its integrity check ({check}); nothing written", EXIT_FAIL)
    os.replace(part, target)
    size = target.stat().st_size
    print(f"{target}  {size} bytes ({_human(size)}), integrity ok")
    return EXIT_OK


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
