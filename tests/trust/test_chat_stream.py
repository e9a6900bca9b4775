"""``/chat`` streaming (issue 32 Low) at the wire: each SSE ``delta`` carries only the new text
(a 24 kB answer cost 12 MB), ``done`` the whole answer; a client hanging up mid-stream is one
info line, no traceback at ERROR, and the answer is still stored. The real anthropic / openai
SDK against the fakes, an aiohttp client over loopback."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fakes.fake_anthropic import Delay, Text
from tests.harness import Harness

pytestmark = [pytest.mark.usefixtures("model_provider"), pytest.mark.app_backends]
ANSWER = "".join(f"第{i}句话，讲一点内容。" for i in range(400))      # ~4.4k characters


def _events(raw: str) -> list[tuple[str, dict]]:
    return [(b.split("\n")[0].removeprefix("event: "), json.loads(b.split("\n")[1].removeprefix("data: ")))
            for b in raw.strip().split("\n\n")]


async def test_deltas_carry_only_the_new_text(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.stream_chunks = 20
        h.model.script(Text(ANSWER))
        async with h.http.post(h.url + "/chat", json={"user_id": "ou_alice", "text": "讲讲"},
                               headers={"Accept": "text/event-stream"}) as r:
            raw = (await r.read()).decode()
        events = _events(raw)
        deltas = [d for name, d in events if name == "delta"]
        assert events[-1][0] == "done" and events[-1][1]["reply"] == ANSWER
        assert len(deltas) > 1, "streamed in pieces"
        assert "".join(d["text"] for d in deltas) == ANSWER and not any(d.get("replace") for d in deltas)
        assert len(raw) < 3 * len(json.dumps(ANSWER)) + 2000, len(raw)       # not quadratic


async def test_a_client_hanging_up_mid_stream_is_one_info_line(tmp_path, capfd):
    async with Harness(tmp_path) as h:
        h.model.stream_chunks, h.model.stream_delay = 20, 0.1      # ~2 s of streaming
        h.model.script(Text(ANSWER))
        async with h.http.post(h.url + "/chat", json={"user_id": "ou_alice", "text": "讲讲"},
                               headers={"Accept": "text/event-stream"}) as r:
            await r.content.readuntil(b"\n\n")          # the first delta, then hang up
            r.close()
        for _ in range(100):
            row = await h.app.db.fetchone("SELECT COUNT(*) AS n FROM messages WHERE role = 'assistant'")
            if row["n"]:
                break
            await asyncio.sleep(0.1)
        assert row["n"] == 1                              # the answer was finished and stored
        await asyncio.sleep(0.3)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert not any("Traceback" in line or '"level": "error"' in line or "Error handling request" in line
                   for line in lines), [line for line in lines if "rror" in line][:5]
