"""Issue 32, High 1-2 and Medium 3, 9: hostile files sent as real signed, encrypted webhook
events, the bytes served by the fake Lark's resource API, every bomb generated here
(tests/reliability/bombs.py). Each test holds one finding:

* the file is parsed in a worker process (bot/media/parse_pool.py), so another chat's webhook is
  acknowledged at once and answered meanwhile;
* the readers (bot/media/readers.py) are linear and bounded: the nested docx is read, the
  text-less PDF sharing one stream is over in a second, the xlsx stops at the text cap, the
  oversized zip member and the 144-megapixel PNG are refused before they are expanded;
* whatever fails — a parser's error, pypdf's LimitReachedError, MemoryError, a timeout, the
  CPU limit, a dead worker — is a short answer, one ``attachment.refused`` line with the ids
  and a ``cause``, and an inbox row that is finished (a restart does not answer it again).

The ack-latency test under attack is at the end; docs/reliability.md (issue 32) has its
numbers and the break that made each test fail.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import pytest

from bot.media.parse_pool import rss_kib
from tests.fakes.fake_anthropic import Text
from tests.fakes.lark_events import make_file_event, make_image_event, make_text_event
from tests.harness import Harness
from tests.reliability import bombs

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")     # sends the bombs
BOB = dict(chat_id="oc_p2p_bob", sender="ou_bob")           # an ordinary chat beside her


def _answer_all(h) -> None:
    h.model.responder = lambda req: Text("好的。")


async def send_attachment(h, name: str, data: bytes, *, chat=ALICE) -> dict:
    key = f"file_v3_{name.replace('.', '_')}_{time.monotonic_ns()}"
    if name.endswith(".png"):
        ev = make_image_event(key, **chat)
        ctype = "image/png"
    else:
        ev = make_file_event(key, name, **chat)
        ctype = "application/octet-stream"
    h.lark.add_resource(ev["event"]["message"]["message_id"], key, data, ctype)
    status, body = await h.post(ev)
    assert status == 200, (status, body)
    return ev


async def inbox_status(h, ev) -> str:
    row = await h.app.db.fetchone("SELECT status FROM inbox WHERE dedup_key = ?",
                                  (f"msg:{ev['event']['message']['message_id']}",))
    return row["status"]


def refused_line(logs, ev) -> dict:
    mid = ev["event"]["message"]["message_id"]
    lines = [e for e in logs.entries if e.get("event") == "attachment.refused" and e.get("message_id") == mid]
    assert len(lines) == 1, lines
    assert lines[0]["chat_id"] and lines[0]["event_id"]
    return lines[0]


async def reply_to(h, ev, timeout: float = 30.0):
    """The bot's reply to ``ev``'s message, waited for without blocking the loop."""
    mid = ev["event"]["message"]["message_id"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = [m for m in h.lark.messages() if m.reply_to == mid]
        if got:
            return got[-1]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no reply to {mid} within {timeout} s")


async def bob_meanwhile(h, busy: asyncio.Event, acks: list[float], n_min: int = 10,
                        n_max: int = 400) -> list[dict]:
    """Bob sends a message every 25 ms while ``busy`` is unset (at least ``n_min``); each
    ack's latency is kept."""
    sent = []
    while (not busy.is_set() or len(sent) < n_min) and len(sent) < n_max:
        ev = make_text_event(f"在吗 {len(sent)}", **BOB)
        t0 = time.perf_counter()
        status, _ = await h.post(ev)
        acks.append(time.perf_counter() - t0)
        assert status == 200
        sent.append(ev)
        await asyncio.sleep(0.025)
    return sent


async def bomb_beside_bob(h, name: str, data: bytes, *, timeout: float = 30.0):
    """Alice's file, Bob chatting meanwhile: (Alice's reply, seconds to it, Bob's ack times)."""
    done = asyncio.Event()
    acks: list[float] = []
    bob = asyncio.create_task(bob_meanwhile(h, done, acks))
    t0 = time.perf_counter()
    try:
        ev = await send_attachment(h, name, data)
        reply = await reply_to(h, ev, timeout)
        took = time.perf_counter() - t0
    finally:
        done.set()
        sent = await bob
    for b in sent:                                                 # every one of Bob's answered
        await reply_to(h, b)
    await h.idle(timeout=30)
    return ev, reply, took, acks


def _user_texts(h) -> list[str]:
    return [h.model.last_user_text(r) for r in h.model.chat_requests()]


# -- High 1: slow readers, off the loop ------------------------------------------------------

async def test_nested_paragraph_docx_is_read_in_linear_time(tmp_path, logs):
    """40 000 paragraphs nested in each other (~1 KB): read in well under a second (the nested
    iter() took ~28 s of CPU for this one, past the worker's limits: refused)."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        ev, reply, took, acks = await bomb_beside_bob(h, "nested.docx", bombs.nested_paragraph_docx(40_000))
        assert any("nested" in t and "nested.docx" in t for t in _user_texts(h)), "the docx text never reached the model"
        assert await inbox_status(h, ev) == "done"
        assert took < 10, took
        print(f"nested docx answered in {took:.2f} s; Bob's acks max {max(acks) * 1000:.0f} ms")


async def test_textless_pdf_sharing_one_stream_is_over_quickly(tmp_path, logs):
    """100 pages, one shared content stream of empty text operators (~17 KB): the stream is
    read once, then "no text" (each page reading it again took ~30 s)."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        ev, reply, took, acks = await bomb_beside_bob(h, "scan.pdf", bombs.textless_pdf())
        assert "没有我能读出的文字" in reply.text, reply.text
        assert refused_line(logs, ev)["reason"] == "no_text"
        assert await inbox_status(h, ev) == "done"
        assert took < 5, took


# -- High 2: expansion bounded before it happens ---------------------------------------------

async def test_xlsx_with_one_shared_string_in_20000_cells_stops_at_the_cap(tmp_path, logs):
    """20 000 cells × one 1 M-character shared string (~50 KB zipped, 20 G characters
    expanded): the first cell fills the 30 000-character cap and the walk stops."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        ev, reply, took, acks = await bomb_beside_bob(h, "sheet.xlsx", bombs.shared_string_xlsx())
        [text] = [t for t in _user_texts(h) if "sheet.xlsx" in t]
        assert "first 30000 characters only" in text and "字" * 1000 in text
        assert len(text) < 32_000
        assert await inbox_status(h, ev) == "done"


async def test_docx_with_an_oversized_member_is_refused_from_the_central_directory(tmp_path, logs):
    """A 64 MiB document.xml zipped to ~300 KB: refused by its declared size, never inflated."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        ev, reply, took, acks = await bomb_beside_bob(h, "big.docx", bombs.big_member_docx(64))
        assert "读不了" in reply.text, reply.text
        line = refused_line(logs, ev)
        assert (line["reason"], line["cause"]) == ("unreadable", "member_size"), line
        assert await inbox_status(h, ev) == "done"
        assert not [t for t in _user_texts(h) if "big.docx" in t]          # the model never asked


# -- Medium 9: pixels counted before decoding -----------------------------------------------

async def test_12000_by_12000_png_is_refused_before_it_is_decoded(tmp_path, logs, capfd):
    """420 KB, 144 megapixels: refused from the header (Pillow's limit used to let it through
    with a raw warning and 825 MB of RSS); nothing printed raw."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        rss0 = rss_kib(_pid())
        ev, reply, took, acks = await bomb_beside_bob(h, "huge.png", bombs.huge_png())
        assert "像素太多" in reply.text, reply.text
        assert refused_line(logs, ev)["cause"] == "pixels"
        assert await inbox_status(h, ev) == "done"
        assert rss_kib(_pid()) - rss0 < 100 * 1024                         # the server decoded nothing
        assert "DecompressionBomb" not in capfd.readouterr().err


# -- Medium 3: poison files finish their row ------------------------------------------------

async def test_pdf_raising_limit_reached_is_answered_and_not_replayed(tmp_path, logs):
    """A content stream inflating past pypdf's 75 MB limit: LimitReachedError is "could not be
    read" (it used to escape: the row stayed pending and every restart tried again)."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        ev = await send_attachment(h, "limit.pdf", bombs.limit_pdf())
        reply = await reply_to(h, ev)
        await h.idle()
        assert "读不了" in reply.text, reply.text
        line = refused_line(logs, ev)
        assert (line["reason"], line["cause"]) == ("unreadable", "limit"), line
        assert await inbox_status(h, ev) == "done"
        await h.restart()
        await asyncio.sleep(0.5)
        await h.idle()
        assert len(h.lark.messages()) == 1                                 # not answered again


@pytest.mark.parametrize("limits, cause", [
    (dict(ethan_parse_timeout=1.0), "timeout"),
    (dict(ethan_parse_cpu_seconds=1.0), "cpu"),
])
async def test_a_parse_past_its_time_is_killed_and_the_worker_replaced(tmp_path, logs, limits, cause):
    """Pages with distinct streams of empty text (~9 s to read): past the wall clock or the
    CPU limit, the worker is ended, the user told, the row finished; the next file is read by
    a new worker."""
    async with Harness(tmp_path, **limits) as h:
        _answer_all(h)
        slow = bombs.textless_pdf(pages=30, ops=15_000, shared=False)
        ev, reply, took, acks = await bomb_beside_bob(h, "slow.pdf", slow)
        assert "读不了" in reply.text, reply.text
        assert refused_line(logs, ev)["cause"] == cause
        assert await inbox_status(h, ev) == "done"
        if cause == "timeout":       # the CPU case's wall time depends on the machine's load;
            assert took < 8, took    # its cause shows the limit, not the full ~9 s read, ended it
        assert h.app.parse_pool.replaced == 1
        ok = await send_attachment(h, "notes.txt", "第二个文件".encode())
        await reply_to(h, ok, 20)
        await h.idle()
        assert any("第二个文件" in t for t in _user_texts(h))
        assert await inbox_status(h, ok) == "done"


async def test_memory_error_in_the_worker_is_could_not_be_read(tmp_path, logs):
    """A 6000×6000 PNG needs ~110 MB decoded; a worker held to 160 MB of address space meets
    MemoryError (or dies): a short answer, the row finished."""
    async with Harness(tmp_path, ethan_parse_memory_mb=160) as h:
        _answer_all(h)
        ev = await send_attachment(h, "mid.png", bombs.huge_png(6000, 6000))
        reply = await reply_to(h, ev)
        await h.idle()
        assert "读不了" in reply.text, reply.text
        assert refused_line(logs, ev)["cause"] in ("memory", "worker_died"), refused_line(logs, ev)
        assert await inbox_status(h, ev) == "done"


async def test_a_large_image_within_the_pixel_cap_still_reaches_the_model(tmp_path):
    """6000×6000 (36 MP, under 40 MP) with the default limits: downscaled, sent as a JPEG."""
    async with Harness(tmp_path) as h:
        _answer_all(h)
        await reply_to(h, await send_attachment(h, "ok.png", bombs.huge_png(6000, 6000)))
        await h.idle()
        last = [m for m in h.model.chat_requests()[-1].json["messages"] if m["role"] == "user"][-1]
        blocks = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "image"]
        assert len(blocks) == 1 and blocks[0]["source"]["media_type"] == "image/jpeg"


# -- the ack under attack --------------------------------------------------------------------

def _pid() -> int:
    import os
    return os.getpid()


class RssSampler:
    """Peak RSS of this process (the app runs in it, with the fakes) and of every parse
    worker, sampled every 20 ms on a thread."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.main_peak = self.worker_peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = _pid()
        while not self._stop.is_set():
            self.main_peak = max(self.main_peak, rss_kib(me))
            for pid in self.pool.pids():
                self.worker_peak = max(self.worker_peak, rss_kib(pid))
            self._stop.wait(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(2)


MAIN_RSS_GROWTH_MB = 150       # docs/reliability.md: the documented bound under attack
WORKER_RSS_MB = 768            # ETHAN_PARSE_MEMORY_MB's default: the address-space cap


async def test_another_chats_ack_stays_fast_while_one_chat_sends_every_bomb(tmp_path, logs):
    """Alice sends each bomb in turn; Bob sends a message every 25 ms all along. Bob's webhook
    acks: p99 < 100 ms; every one of Bob's messages answered; the server's RSS grows by less
    than MAIN_RSS_GROWTH_MB, no worker past its cap. Besides the bombs, a PDF that is slow by
    honest means (30 pages, each its own text-less stream, ~9 s to read) meets the wall clock
    (3 s here): even a reader with no bug to fix never holds the loop."""
    async with Harness(tmp_path, ethan_parse_timeout=3.0) as h:
        _answer_all(h)
        await reply_to(h, await send_attachment(h, "warm.txt", b"warm up"))   # the first worker's start-up
        await h.idle()
        built = {key: (name, build()) for key, (name, build) in bombs.BOMBS.items()}   # before the baseline
        built["slow_pdf"] = ("slow.pdf", bombs.textless_pdf(pages=30, shared=False))
        base = rss_kib(_pid())
        all_acks: list[float] = []
        rows = []
        with RssSampler(h.app.parse_pool) as rss:
            for key, (name, data) in built.items():
                ev, reply, took, acks = await bomb_beside_bob(h, name, data)
                all_acks += acks
                rows.append((key, len(data), took, max(acks), await inbox_status(h, ev)))
        all_acks.sort()
        p99 = all_acks[int(len(all_acks) * 0.99) - 1]
        for key, size, took, worst, status in rows:
            print(f"{key:16} {size:>8} B  answered in {took:5.2f} s  Bob's worst ack {worst * 1000:5.1f} ms  row {status}")
        growth = (rss.main_peak - base) / 1024
        print(f"Bob: {len(all_acks)} acks, p50 {statistics.median(all_acks) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms;"
              f" main RSS {base / 1024:.0f} MB, peak +{growth:.0f} MB; worker peak {rss.worker_peak / 1024:.0f} MB")
        assert all(status == "done" for *_, status in rows), rows
        assert p99 < 0.100, p99
        assert growth < MAIN_RSS_GROWTH_MB, growth
        assert rss.worker_peak / 1024 < WORKER_RSS_MB, rss.worker_peak
        assert not [e for e in logs.entries if e.get("event") == "dispatch.job_failed"]
