"""Episode vectors (issue 31): what recall's semantic ranking reads, and the indexer that writes them.

Table ``episode_vectors`` (schema v11): per episode and embedding model, one unit vector for
the summary (``seq`` -1) and one per indexed line of what was said (``seq`` = the line's place
in ``chunks.session_lines``), so a match points at the line to show as evidence.

* SQLite: float32 BLOBs in sqlite-vec's format, ranked by its ``vec_distance_cosine``. Where
  Python's sqlite3 cannot load extensions (builds without ``enable_load_extension``, as the
  Python on this project's machines), a function of the same name over the same BLOBs is
  registered on the connection instead (``ensure_vec``).
* PostgreSQL: ``REAL[]``; ranked by pgvector's ``<=>`` when the ``vector`` extension is there
  (the v11 migration tries ``CREATE EXTENSION vector``), else by a dot product in SQL — the
  vectors are unit length, so both are the cosine.

Both filter by the owner and the chat's visibility in SQL (``episodic._where``), brute force
over that user's vectors: a user's episodes are hundreds of rows, not millions.

Vectors go with their episode (foreign-key cascade: erase, ``/forget all``, session delete) and
are dropped whenever its summary or turns change (triggers: ``/forget <fact>``, an erased
member's redaction, a resumed session written again); the ``EmbeddingIndexer`` then embeds the
episode again in the background. A model change needs nothing: episodes without vectors of the
configured model are embedded anew, the other model's rows replaced as each one is.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from operator import mul
import logging
import math
import sqlite3
import struct
import time
from typing import Any, Sequence

from storage import Database, dialect_of
from memory.episodes.chunks import session_lines
from memory.episodes.embedding import Embedder, EmbeddingError, pack

log = logging.getLogger(__name__)

SUMMARY_SEQ = -1
FALLBACK_VERSION = "python-fallback"
BATCH_TEXTS = 16             # texts per embedding call
EPISODES_PER_ROUND = 8       # episodes read per indexing round
IDLE_POLL_S = 5.0            # how often an idle indexer looks for episodes without vectors
BACKOFF_S = (1.0, 60.0)      # first and longest wait after a failed embedding call

_pg_vector: dict[int, bool] = {}


def _cosine_distance(a: bytes, b: bytes) -> float | None:
    """sqlite-vec's vec_distance_cosine over two float32 BLOBs (the fallback's Python body)."""
    if a is None or b is None or len(a) != len(b) or not a:
        return None
    n = len(a) // 4
    x = struct.unpack(f"<{n}f", a)
    y = struct.unpack(f"<{n}f", b)
    dot = sum(p * q for p, q in zip(x, y))
    nx = math.sqrt(sum(p * p for p in x))
    ny = math.sqrt(sum(q * q for q in y))
    return 1.0 - dot / (nx * ny) if nx and ny else 1.0


def sqlite_vec_loads(conn: Any) -> bool:
    """Load the sqlite-vec extension into ``conn`` (False where sqlite3 cannot load extensions)."""
    if not hasattr(conn, "enable_load_extension"):
        return False
    try:
        import sqlite_vec
        conn.enable_load_extension(True)
        try:
            sqlite_vec.load(conn)
        finally:
            conn.enable_load_extension(False)
        return True
    except Exception as e:                  # noqa: BLE001 — any failure: the fallback below
        log.info("vectors.sqlite_vec_unavailable", extra={"error": str(e)[:200]})
        return False


def ensure_vec(conn: Any) -> bool:
    """``vec_distance_cosine`` on this SQLite connection: True when it is sqlite-vec's; else the
    same function in Python is registered (for any SQL that names it) and False is returned.
    (Probed per call: sqlite3 connections take no weak references, and ids are reused.)"""
    try:
        return conn.execute("SELECT vec_version()").fetchone()[0] != FALLBACK_VERSION
    except sqlite3.OperationalError:
        pass
    if sqlite_vec_loads(conn):
        return True
    conn.create_function("vec_distance_cosine", 2, _cosine_distance, deterministic=True)
    conn.create_function("vec_version", 0, lambda: FALLBACK_VERSION, deterministic=True)
    return False


def _numpy() -> Any:
    try:
        import numpy
        return numpy
    except ImportError:       # numpy comes with the local model; a remote model needs none
        return None


def _dot_with(query: Sequence[float]):
    q = array("f", query)
    def dot(blob: bytes) -> float | None:
        v = array("f")
        v.frombytes(blob)
        return sum(map(mul, v, q)) if len(v) == len(q) else None
    return dot


def _has_pgvector(conn: Any) -> bool:
    key = id(getattr(conn, "raw", conn))
    if key not in _pg_vector:
        _pg_vector[key] = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is not None
    return _pg_vector[key]


def to_db(conn: Any, vec: Sequence[float]) -> Any:
    return list(map(float, vec)) if dialect_of(conn) == "postgres" else pack(vec)


# --- reads ------------------------------------------------------------------------------


def nearest(conn: Any, where: list[str], params: list[Any], model: str, query: Sequence[float],
            depth: int) -> list[tuple[int, int, float]]:
    """Run by Database.read: (episode id, seq, cosine similarity) of the ``depth`` vectors of
    ``model`` nearest ``query`` among the episodes ``where`` admits (owner, visibility), best first."""
    cond = " AND ".join(where)
    if dialect_of(conn) == "postgres":
        if _has_pgvector(conn):
            sim = "1.0 - (v.vec::vector <=> ?::real[]::vector)"
        else:
            sim = "(SELECT SUM(a * b) FROM unnest(v.vec, ?::real[]) AS t(a, b))"
        rows = conn.execute(
            f"SELECT v.episode_id AS eid, v.seq AS seq, {sim} AS sim FROM episode_vectors v"
            f" JOIN episodes e ON e.id = v.episode_id WHERE v.model = ? AND {cond}"
            " ORDER BY sim DESC, v.episode_id DESC, v.seq LIMIT ?",
            [list(map(float, query)), model, *params, depth]).fetchall()
    elif ensure_vec(conn):
        rows = conn.execute(
            "SELECT v.episode_id AS eid, v.seq AS seq, 1.0 - vec_distance_cosine(v.vec, ?) AS sim"
            f" FROM episode_vectors v JOIN episodes e ON e.id = v.episode_id WHERE v.model = ? AND {cond}"
            " ORDER BY sim DESC, v.episode_id DESC, v.seq LIMIT ?",
            [pack(query), model, *params, depth]).fetchall()
    else:
        # No sqlite-vec: the same cosine (unit vectors: a dot product) over the user's rows in
        # one matrix product when numpy is there (a SQL function per row cost ~40 µs a row),
        # else per row with the query unpacked once
        np = _numpy()
        if np is not None:
            got = conn.execute(
                "SELECT v.episode_id AS eid, v.seq AS seq, v.vec AS vec FROM episode_vectors v"
                f" JOIN episodes e ON e.id = v.episode_id WHERE v.model = ? AND {cond}",
                [model, *params]).fetchall()
            q = np.asarray(query, dtype="<f4")
            keep = [r for r in got if len(r["vec"]) == 4 * len(q)]
            if not keep:
                return []
            # einsum, not @: a matrix-vector product this small is slower in BLAS threads under load
            sims = np.einsum("ij,j->i", np.frombuffer(b"".join(r["vec"] for r in keep), dtype="<f4")
                             .reshape(len(keep), len(q)), q)
            order = sorted(range(len(keep)), key=lambda i: (-float(sims[i]), -keep[i]["eid"], keep[i]["seq"]))
            return [(int(keep[i]["eid"]), int(keep[i]["seq"]), float(sims[i])) for i in order[:depth]]
        conn.create_function("ethan_vec_dot", 1, _dot_with(query), deterministic=True)
        rows = conn.execute(
            "SELECT v.episode_id AS eid, v.seq AS seq, ethan_vec_dot(v.vec) AS sim"
            f" FROM episode_vectors v JOIN episodes e ON e.id = v.episode_id WHERE v.model = ? AND {cond}"
            " ORDER BY sim DESC, v.episode_id DESC, v.seq LIMIT ?",
            [model, *params, depth]).fetchall()
    return [(int(r["eid"]), int(r["seq"]), float(r["sim"] or 0.0)) for r in rows]


def _pending(conn: Any, model: str, limit: int) -> list[int]:
    rows = conn.execute(
        "SELECT e.id AS id FROM episodes e WHERE NOT EXISTS (SELECT 1 FROM episode_vectors v"
        " WHERE v.episode_id = e.id AND v.model = ?) ORDER BY e.id DESC LIMIT ?", (model, limit)).fetchall()
    return [int(r["id"]) for r in rows]


def _texts(conn: Any, episode_id: int) -> tuple[str, list[str], str] | None:
    """(summary, lines, digest) of an episode as it is now; None when it is gone."""
    row = conn.execute("SELECT summary FROM episodes WHERE id = ?", (episode_id,)).fetchone()
    if row is None:
        return None
    chunks = [r["text"] for r in conn.execute(
        "SELECT text FROM episode_chunks WHERE episode_id = ? ORDER BY seq", (episode_id,)).fetchall()]
    digest = hashlib.sha256("\x00".join([row["summary"], *chunks]).encode()).hexdigest()
    return row["summary"], session_lines(chunks), digest


def _store(conn: Any, episode_id: int, model: str, digest: str, vectors: list[list[float]]) -> bool:
    """Run by Database.write: the episode's vectors of ``model`` (its other rows replaced) —
    unless it changed while it was being embedded (then the next round embeds it again)."""
    now = _texts(conn, episode_id)
    if now is None or now[2] != digest:
        return False
    conn.execute("DELETE FROM episode_vectors WHERE episode_id = ?", (episode_id,))
    conn.executemany(
        "INSERT INTO episode_vectors(episode_id, seq, model, dim, vec) VALUES (?, ?, ?, ?, ?)",
        [(episode_id, SUMMARY_SEQ + i, model, len(v), to_db(conn, v)) for i, v in enumerate(vectors)])
    return True


async def count(db: Database, model: str | None = None) -> int:
    if model is None:
        row = await db.fetchone("SELECT COUNT(*) AS n FROM episode_vectors")
    else:
        row = await db.fetchone("SELECT COUNT(*) AS n FROM episode_vectors WHERE model = ?", (model,))
    return int(row["n"])


# --- the background indexer -------------------------------------------------------------


class EmbeddingIndexer:
    """Embeds episodes that have no vectors of ``embedder.model`` — new ones, changed ones
    (forget, redaction), all of them after a model change — in a task of its own, never on the
    reply path. ``nudge()`` after an episode is written; it also looks every ``IDLE_POLL_S``.
    A failing endpoint is retried with backoff, logged once per outage."""

    def __init__(self, db: Database, embedder: Embedder, *, poll_s: float = IDLE_POLL_S,
                 clock=time.monotonic) -> None:
        self.db = db
        self.embedder = embedder
        self.poll_s = poll_s
        self.clock = clock
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._failing = False
        self.embedded = 0            # episodes embedded since start (bench, tests)
        self.seconds = 0.0           # time spent in embedding calls (bench: the cost apart)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="embedding-indexer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):   # noqa: BLE001 — stopping
                pass
            self._task = None

    def nudge(self) -> None:
        self._idle.clear()
        self._wake.set()

    async def wait_idle(self, timeout: float = 60.0) -> bool:
        """True once no episode waits for vectors (or False after ``timeout``)."""
        self.nudge()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def run_once(self) -> int:
        """One round: embed up to ``EPISODES_PER_ROUND`` waiting episodes; returns how many."""
        model = self.embedder.model
        done = 0
        for eid in await self.db.read(_pending, model, EPISODES_PER_ROUND):
            got = await self.db.read(_texts, eid)
            if got is None:
                continue
            summary, lines, digest = got
            texts = [summary, *lines]
            vectors: list[list[float]] = []
            t0 = time.perf_counter()
            for i in range(0, len(texts), BATCH_TEXTS):
                vectors += await self.embedder.embed(texts[i:i + BATCH_TEXTS])
            self.seconds += time.perf_counter() - t0
            if len(vectors) != len(texts):
                raise EmbeddingError(f"{len(texts)} texts gave {len(vectors)} vectors")
            if await self.db.write(_store, eid, model, digest, vectors):
                done += 1
                self.embedded += 1
        return done

    async def _run(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            self._wake.clear()
            try:
                n = await self.run_once()
                if self._failing:
                    self._failing = False
                    log.info("embedding.index_restored", extra={"model": self.embedder.model})
                backoff = BACKOFF_S[0]
            except asyncio.CancelledError:
                raise
            except Exception as e:            # noqa: BLE001 — the endpoint or the database: retry
                if not self._failing:
                    self._failing = True
                    log.warning("embedding.index_failed", extra={"model": self.embedder.model, "error": str(e)[:200]})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])
                continue
            if n:
                continue
            self._idle.set()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
