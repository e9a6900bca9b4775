"""``ethan memory export|import``: one user's memory as the spec's files, and back.

The export writes a directory (memory/governance/export.py); the import validates one and adds
it all or nothing, a refusal one line. Apart from the other subcommands: one command family.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bot.infra.cli.runner import EXIT_OK, CliError, _open, _user
from bot.infra.config import Settings

# --------------------------------------------------------------------------------------
# ethan memory …
# --------------------------------------------------------------------------------------

async def _memory_export(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.export import export_user

    user = _user(args.user)
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise CliError(f"ethan: --out {out}: exists and is not a directory")
    db = await _open(settings)
    try:
        result = await export_user(db, user, out)
    finally:
        await db.close()
    c = result.counts
    print(f"exported {user} to {result.directory}: {c['facts']} facts, {c['procedures']} rules, "
          f"{c['profile_entries']} profile entries, {c['episodes']} episodes")
    for f in result.files:
        print(f"  {f}")
    if not any(c.values()):
        print(f"  note: nothing is stored for {user} (check the open_id; `ethan session list` shows the chats)")
    return EXIT_OK


async def _memory_import(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.export_format import ImportRefused
    from memory.governance.import_ import import_user

    user = _user(args.user)
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise CliError(f"ethan: {directory}: not a directory")
    db = await _open(settings, create=True)
    try:
        try:
            result = await import_user(db, user, directory)
        except ImportRefused as e:
            raise CliError(f"ethan: import refused, nothing was imported: {e}") from None
    finally:
        await db.close()
    a, u = result.added, result.unchanged
    print(f"imported into {user} from {directory}:")
    for key, label in (("facts", "facts"), ("procedures", "rules"), ("profile_entries", "profile entries"),
                       ("episodes", "episodes")):
        print(f"  {label:<16} {a[key]} added, {u[key]} already there")
    if result.missing:
        print(f"  not in the directory (skipped): {', '.join(result.missing)}")
    if result.exported_user and result.exported_user != user:
        print(f"  note: exported from {result.exported_user}; now owned by {user}")
    return EXIT_OK


MEMORY_ACTIONS = {"export": _memory_export, "import": _memory_import}
