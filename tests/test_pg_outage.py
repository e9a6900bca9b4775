"""PostgreSQL stopped while Ethan runs: /healthz is not ready and the webhook answers 503
(Lark retries), never 500; once the server is back, /healthz recovers and the retried event
is answered — nothing acknowledged is lost. The test's own cluster (the session's is shared)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.fake_anthropic import Text
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness
from tests.pg_cluster import Cluster, find_bindir


@pytest.fixture
def own_cluster(pg_cluster):   # pg_cluster: the one-line install hint when binaries are missing
    c = Cluster(find_bindir()).start()
    try:
        c.migrated_template()
        yield c
    finally:
        c.stop()


async def _health(h: Harness) -> int:
    async with h.http.get(h.url + "/healthz") as r:
        return r.status


async def test_database_down_then_back(tmp_path, own_cluster):
    url = own_cluster.new_database()
    async with Harness(tmp_path, ethan_database_url=url) as h:
        h.model.script(Text("first"), Text("second"))
        await h.send_text("before the outage")
        await h.replies(1)
        assert await _health(h) == 200

        await asyncio.to_thread(own_cluster.pg_ctl, "stop", "-m", "fast", "-w")
        assert await _health(h) == 503
        ev = make_text_event("during the outage", chat_id="oc_p2p_alice", chat_type="p2p", sender="ou_alice")
        status, _ = await h.post(ev)
        assert status == 503          # not acknowledged: Lark delivers it again

        await asyncio.to_thread(own_cluster.pg_ctl, "start", "-w", "-t", "60", "-l", str(own_cluster.dir / "log"),
                                "-o", f"-p {own_cluster.port} -k {own_cluster.dir} -c listen_addresses=127.0.0.1 -c fsync=off")
        for _ in range(100):
            if await _health(h) == 200:
                break
            await asyncio.sleep(0.1)
        assert await _health(h) == 200
        status, _ = await h.post(ev)  # Lark's retry
        assert status == 200
        replies = await h.replies(2)
        assert [r.text for r in replies] == ["first", "second"]
