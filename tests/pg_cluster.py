"""A throwaway PostgreSQL cluster for the suite: initdb in a temp folder as the ``postgres``
user, a free loopback port, the unix socket in that folder, removed at the end of the session.

Each test gets a fresh database as ``CREATE DATABASE … TEMPLATE ethan_template`` of a
template migrated once per session (a file copy on the server: ~10 ms instead of migrating).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL_HINT = ("PostgreSQL server binaries not found (initdb/pg_ctl): install them with "
                "`apt-get install postgresql` (Debian) — the store tests run on both backends")


def find_bindir() -> Path | None:
    env = os.environ.get("ETHAN_PG_BINDIR")
    if env:     # named: that folder or nothing (a wrong path is not silently replaced)
        return Path(env) if (Path(env) / "initdb").exists() and (Path(env) / "pg_ctl").exists() else None
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(str(Path(os.path.realpath(which)).parent))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, bindir: Path, *, durable: bool = False) -> None:
        self.bindir = bindir
        # Fast by default: nothing is lost unless the server itself crashes. A test that
        # crashes it (``stop_server("immediate")``) needs commits that survive that, as on a
        # real server: synchronous_commit=off forgets the last acknowledged commits.
        self.durable = durable
        self.dir = Path(tempfile.mkdtemp(prefix="ethan-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._names = itertools.count(1)
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # initdb refuses root: the cluster belongs to the postgres user (Debian creates it).
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)

    def start(self) -> "Cluster":
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                  "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start the (initialised) server; also after ``stop_server`` (an outage test)."""
        speed = "" if self.durable else "-c synchronous_commit=off "
        self.pg_ctl("start", "-w", "-t", "60", "-l", str(self.dir / "log"),
                    "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                          f"{speed}-c full_page_writes=off -c max_connections=300")

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data (``fast``: open connections are terminated, as
        by an operator's restart; ``immediate``: as by a crash)."""
        self.pg_ctl("stop", "-m", mode, "-w", "-t", "60")

    def pg_ctl(self, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args)

    def password_role(self, role: str, password: str) -> None:
        """A login role that must give ``password`` over TCP (scram; every other role keeps the
        cluster's trust rule): for the tests of refused logins."""
        self.admin(f"DROP ROLE IF EXISTS {role}")
        self.admin(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
        hba = self.data / "pg_hba.conf"
        rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
        text = hba.read_text()
        if rule not in text:
            hba.write_text(rule + text)
            self.pg_ctl("reload")
            time.sleep(0.2)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, sql: str) -> None:
        import psycopg
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def migrated_template(self) -> None:
        import asyncio
        from storage.postgres import PgDatabase
        self.admin("CREATE DATABASE ethan_template")
        import psycopg
        with psycopg.connect(self.url("ethan_template"), autocommit=True) as conn:
            # pgvector where the server has it (.ci/run installs it where Debian ships it): the
            # v11 migration would try too; created here so every test database starts with it
            if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

        async def migrate() -> None:
            db = await PgDatabase(self.url("ethan_template"), pool_size=1).open()
            await db.close()
        asyncio.run(migrate())

    def new_database(self, template: str = "ethan_template") -> str:
        name = f"t{os.getpid()}_{next(self._names)}"
        for attempt in range(50):
            try:
                self.admin(f"CREATE DATABASE {name} TEMPLATE {template}")
                break
            except Exception as e:   # the template is briefly in use by a closing connection
                if "being accessed" not in str(e) or attempt == 49:
                    raise
                time.sleep(0.05)
        return self.url(name)

    def stop(self) -> None:
        try:
            self.pg_ctl("stop", "-m", "immediate", "-w")
        except Exception:
            pass
        # Removed by a detached `rm`: on a disk busy with other clusters' writes the unlink of
        # thousands of files can take minutes, and the session's last test would time out on it.
        subprocess.Popen(["rm", "-rf", self.dir], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
