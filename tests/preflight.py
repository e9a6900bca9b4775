"""What `make test` needs beyond Python and make, checked before the suite starts: one line
naming what is missing and how to get it (exit 2), instead of a fixture error minutes in.
libfaketime is optional (the two tests/replicas tests that run a replica's clock 40 s ahead
are skipped without it): its absence is one note on stdout, never a refusal.
`make test-quick` needs none of these and does not run this.

    python -m tests.preflight        (the Makefile's `test` target runs it first)
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

from tests.pg_cluster import find_bindir


def missing() -> list[str]:
    needs = []
    if find_bindir() is None:
        needs.append("PostgreSQL server binaries (apt-get install postgresql, or ETHAN_PG_BINDIR=<dir with initdb>)")
    elif os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:    # initdb refuses root: the throwaway cluster runs as `postgres`
            needs.append("a `postgres` user to run the test cluster as root (apt-get install postgresql creates it)")
    chromium = os.environ.get("ETHAN_CHROMIUM", "/usr/bin/chromium")
    if not (Path(chromium).is_file() and os.access(chromium, os.X_OK)) and not shutil.which(chromium):
        needs.append(f"Chromium at {chromium} (apt-get install chromium, or ETHAN_CHROMIUM=<path>)")
    return needs


FAKETIME_NOTE = ("make test: libfaketime not found — the 2 replica tests with a clock 40 s ahead will be "
                 "skipped (apt-get install faketime, or ETHAN_FAKETIME=<path to libfaketime.so.1>)")


def find_faketime() -> Path | None:
    """libfaketime's preload library (ETHAN_FAKETIME, else Debian's multiarch paths), or None."""
    env = os.environ.get("ETHAN_FAKETIME")
    if env:     # named: that file or nothing (a wrong path is not silently replaced)
        return Path(env) if Path(env).is_file() else None
    for path in sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")) + [Path("/usr/lib/faketime/libfaketime.so.1")]:
        if path.is_file():
            return path
    return None


def main() -> int:
    needs = missing()
    if needs:
        print("make test needs: " + "; ".join(needs), file=sys.stderr)
        return 2
    if find_faketime() is None:
        print(FAKETIME_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
