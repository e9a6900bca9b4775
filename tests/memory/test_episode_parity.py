"""Episode search and recall give the same answers on SQLite (FTS5's bm25()) and PostgreSQL
(the same BM25 over the GIN-indexed term arrays, memory/episodes/search.py): one corpus written to
both engines, every query of the labelled sets asked of both, the results compared — order,
scores, matched words, excerpts."""

from __future__ import annotations

import pytest

from storage import database
from memory.episodes.keywords import MAX_QUERY_TERMS
from memory.episodes.record import _where
from memory.episodes.search import _bm25_rows, pg_bm25_query
from memory.episodes.store import EpisodeStore
from memory.text.tokenizer import search_terms
from memory.scope import Scope
from tests.memory import episodes_labelled as L
from tests.memory import recall_corpus as R

METHODS = ("rrf", "bm25", "turns", "tf")


@pytest.fixture
def backend() -> str:
    return "sqlite"        # this module opens both engines itself


@pytest.fixture
async def engines(tmp_path, pg_cluster):
    """{"sqlite": store, "postgres": store}, each holding the same episodes."""
    stores = {}
    dbs = []
    try:
        for name, target in (("sqlite", tmp_path / "parity.db"), ("postgres", pg_cluster.new_database())):
            db = await database(target).open()
            dbs.append(db)
            store = EpisodeStore(db)
            await L.load(store)
            c = R.corpus(seed=19, users=4, sessions_per_user=8)
            await R.load(store, c)
            # a group episode and another user's, so the owner and visibility filters matter
            await store.write(session_id="g1", user_id=L.LIN, chat_id="oc_team", chat_type="group",
                              summary="用户在群里讨论 MySQL 慢查询和索引，决定给 orders 表加联合索引。",
                              turn_count=3, turns=["林: orders 表的慢查询要加索引", "赵: 先 EXPLAIN 看看"],
                              timestamp=1_770_000_000.0)
            stores[name] = store
        yield stores
    finally:
        for db in dbs:
            await db.close()


def _queries() -> list[tuple[str, str]]:
    c = R.corpus(seed=19, users=4, sessions_per_user=8)
    return ([(u, q) for u, q, _ in L.QUERIES] + list(L.UNRELATED)
            + [(u, q) for u, q, _ in c.questions] + list(c.unrelated)
            + [(L.LIN, "慢查询"), (L.LIN, "索引"), (L.EMMA, "user interviews churn"),
               (L.EMMA, "pricing page experiment"), (L.LIN, "redis 集群")])


def _search_view(eps):
    return [(e.user_id, e.session_id, e.score) for e in eps]


def _recall_view(eps):
    return [(e.user_id, e.session_id, e.score, e.matched, e.excerpt, e.summary) for e in eps]


async def test_search_ranks_the_same_on_both_engines(engines):
    lite, pg = engines["sqlite"], engines["postgres"]
    compared = found = 0
    for user, q in _queries():
        for method in METHODS:
            a = _search_view(await lite.search(user, q, limit=8, method=method))
            b = _search_view(await pg.search(user, q, limit=8, method=method))
            assert a == b, (user, q, method)
            compared += 1
            found += bool(a)
        for sc in (Scope(user, f"oc_{user}_p2p", "p2p"), Scope(user, "oc_team", "group")):
            a = _search_view(await lite.search(user, q, limit=8, scope=sc))
            b = _search_view(await pg.search(user, q, limit=8, scope=sc))
            assert a == b, (user, q, sc)
    assert compared > 800 and found > compared // 2     # the comparison covered real results


async def test_bm25_scores_are_fts5s_to_the_last_bit(engines):
    """The raw rankings (what RRF fuses), not only the order: FTS5's bm25() and the SQL BM25
    are the same float8 arithmetic."""
    for user, q in _queries()[:60]:
        terms = search_terms(q)[:MAX_QUERY_TERMS]
        if not terms:
            continue
        where, params = _where(user, None, None)
        for table in ("episodes", "episode_chunks"):
            a = await engines["sqlite"].db.read(_bm25_rows, table, " AND ".join(where), params, terms, 200)
            b = await engines["postgres"].db.read(_bm25_rows, table, " AND ".join(where), params, terms, 200)
            ids = await engines["sqlite"].db.fetchall("SELECT id, session_id FROM episodes")
            pg_ids = await engines["postgres"].db.fetchall("SELECT id, session_id FROM episodes")
            sa = {r["id"]: r["session_id"] for r in ids}
            sb = {r["id"]: r["session_id"] for r in pg_ids}
            assert [(sa[i], s) for i, _, s in a] == [(sb[i], s) for i, _, s in b], (q, table)


async def test_recall_decides_the_same_on_both_engines(engines):
    lite, pg = engines["sqlite"], engines["postgres"]
    recalled = 0
    for user, q in _queries():
        for sc in (Scope(user, f"oc_{user}", "p2p"), Scope(user, f"oc_{user}_p2p", "p2p"),
                   Scope(user, "oc_team", "group")):
            a = _recall_view(await lite.recall(sc, q))
            b = _recall_view(await pg.recall(sc, q))
            assert a == b, (user, q, sc)
            recalled += bool(a)
    assert recalled > 100


async def test_the_index_statistics_follow_writes_and_deletes(engines):
    """N and the token total PostgreSQL's BM25 reads (schema v9) stay what FTS5 counts
    through rewrites, session deletes and a user's erasure; search still agrees after."""
    lite, pg = engines["sqlite"], engines["postgres"]
    for store in (lite, pg):
        await store.write(session_id="l01", user_id=L.LIN, chat_type="p2p", chat_id=f"oc_{L.LIN}_p2p",
                          summary="用户又来问 MySQL 慢查询，这次是 payments 表。", turn_count=3,
                          turns=["payments 表很慢", "加了索引"], timestamp=1_780_000_000.0)
        await store.delete_session("ou_gen1:2")
        await store.delete_all(L.ZHAO)
    stats = {r["name"]: (r["n_rows"], r["n_tokens"]) for r in
             await pg.db.fetchall("SELECT name, n_rows, n_tokens FROM episode_index_stats")}
    for table in ("episodes", "episode_chunks"):
        rows = await pg.db.fetchall(f"SELECT terms FROM {table}")
        assert stats[table] == (len(rows), sum(len(r["terms"].split()) for r in rows))
        lite_rows = await lite.db.fetchall(f"SELECT terms FROM {table}")
        assert stats[table] == (len(lite_rows), sum(len(r["terms"].split()) for r in lite_rows))
    for user, q in _queries()[:40]:
        for method in ("bm25", "turns", "rrf"):
            assert (_search_view(await lite.search(user, q, method=method))
                    == _search_view(await pg.search(user, q, method=method))), (q, method)


async def test_a_copied_database_searches_the_same(engines, pg_cluster):
    """`ethan db copy`: the rows arrive by INSERT … ON CONFLICT DO NOTHING, and the triggers
    count them into episode_index_stats, so search on the copy is SQLite's."""
    from memory.governance.copy import copy_database

    lite = engines["sqlite"]
    target = await database(pg_cluster.new_database()).open()
    try:
        await copy_database(lite.db, target)
        await copy_database(lite.db, target)          # idempotent: counted once
        copy = EpisodeStore(target)
        for table in ("episodes", "episode_chunks"):
            row = await target.fetchone("SELECT n_rows, n_tokens FROM episode_index_stats WHERE name = ?", (table,))
            rows = await lite.db.fetchall(f"SELECT terms FROM {table}")
            assert (row["n_rows"], row["n_tokens"]) == (len(rows), sum(len(r["terms"].split()) for r in rows))
        for user, q in _queries()[:40]:
            for method in ("bm25", "turns", "rrf"):
                assert (_search_view(await lite.search(user, q, method=method))
                        == _search_view(await copy.search(user, q, method=method))), (q, method)
    finally:
        await target.close()


async def test_postgres_search_uses_the_gin_indexes(engines):
    pg = engines["postgres"].db
    await pg.execute("ANALYZE")
    where, params = _where(L.LIN, None, None)
    for table in ("episodes", "episode_chunks"):
        sql, args = pg_bm25_query(table, " AND ".join(where), params, ["慢查询", "索引"], 50)

        def explain(conn, sql=sql, args=args):
            conn.execute("SET enable_seqscan = off")   # a small table: show what the planner can use
            return [r[0] for r in conn.execute("EXPLAIN " + sql, args).fetchall()]
        plan = "\n".join(await pg.read(explain))
        assert f"Bitmap Index Scan on {table}_terms" in plan, plan
