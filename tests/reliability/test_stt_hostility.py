"""Issue 45, N9: a speech-to-text server's answer is bounded in length and in time (bot/media/stt.py).

A voice message goes in as a real signed, encrypted webhook event, its audio served by the fake
Lark's resource API and measured in the parse pool; the transcription is asked of the fake STT
server (tests/fakes/fake_stt.py) through the real ``openai`` client. Before the fix a 3-second
message "transcribed" as 20 M characters was read whole, stored as one 60 MB row and echoed to
Lark, and a server sending a byte every 2 s held the chat for a minute under a 5 s
ETHAN_STT_TIMEOUT. Now the answer is read with a byte cap and held to a length the audio could
hold (``transcript_cap``), and ETHAN_STT_TIMEOUT is a deadline for the whole call.
"""

from __future__ import annotations

import time

import pytest

from bot.media.stt import transcript_cap
from tests.fakes.fake_anthropic import Text
from tests.fakes.fake_stt import ogg_opus
from tests.fakes.lark_events import make_audio_event
from tests.harness import Harness
from tests.reliability.test_file_bombs import inbox_status, refused_line, reply_to

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


def _harness(tmp_path, stt, **kw) -> Harness:
    return Harness(tmp_path, ethan_stt_model="whisper-1", ethan_stt_base_url=stt.base_url,
                   ethan_stt_api_key="sk-stt", **kw)


async def _voice(h, audio: bytes, seconds: float) -> dict:
    ev = make_audio_event("file_v3_voice", duration_ms=int(seconds * 1000), **ALICE)
    h.lark.add_resource(ev["event"]["message"]["message_id"], "file_v3_voice", audio, "audio/ogg")
    status, body = await h.post(ev)
    assert status == 200, (status, body)
    return ev


async def _nothing_kept(h, ev) -> None:
    assert h.model.chat_requests() == []                                  # the model never asked
    assert await h.app.db.fetchall("SELECT id FROM messages") == []       # nothing stored
    assert await inbox_status(h, ev) == "done"


@pytest.mark.parametrize("chars", [20_000_000, 1_000], ids=["20M_chars", "1000_chars"])
async def test_a_transcript_longer_than_its_audio_could_hold_is_refused(tmp_path, logs, stt, chars):
    """3 s of audio: 20 M characters (60 MB of UTF-8) is cut off at the byte cap, never read
    whole; 1 000 characters (3 KB, within the byte cap) is past the 275 characters 3 s can
    hold. Either way: a short answer, one ``attachment.refused`` line (``stt_too_long``, the
    bound), nothing stored, nothing echoed, the model never asked."""
    audio = ogg_opus(3, tag=b"bomb")
    stt.add(audio, "啊" * chars)
    async with _harness(tmp_path, stt) as h:
        h.model.responder = lambda req: Text("好的。")
        ev = await _voice(h, audio, 3)
        reply = await reply_to(h, ev, 30)
        await h.idle()
        assert "远远超出" in reply.text and len(reply.text) < 100, reply.text[:200]
        assert len(h.lark.messages()) == 1                                  # no echo of the "transcript"
        line = refused_line(logs, ev)
        assert line["reason"] == "stt_too_long" and line["max_chars"] == transcript_cap(3) == 275, line
        assert not [e for e in logs.entries if e.get("event") == "voice.transcribed"]
        assert stt.sent < 16 << 20              # of 60 MB: the bot stopped reading at its cap
        await _nothing_kept(h, ev)


async def test_a_transcript_within_the_bound_is_answered(tmp_path, logs, stt):
    """The bound is not a ceiling on real speech: 275 characters for 3 s goes through."""
    audio = ogg_opus(3, tag=b"fast")
    stt.add(audio, "快" * transcript_cap(3))
    async with _harness(tmp_path, stt) as h:
        h.model.responder = lambda req: Text("好的。")
        ev = await _voice(h, audio, 3)
        await reply_to(h, ev, 30)
        await h.idle()
        assert "快" * transcript_cap(3) in h.model.last_user_text(h.model.chat_requests()[-1])


async def test_a_trickling_stt_server_is_cut_at_the_whole_calls_deadline(tmp_path, logs, stt):
    """ETHAN_STT_TIMEOUT=3: the server answers at once, then a byte every 2 s (60 bytes, then the
    JSON) — no read ever waits 3 s, so a read timeout never fires (before: the chat held ~2
    minutes). The call ends at 3 s: "unavailable, try again", one ``attachment.refused`` line
    (``stt_unreachable``), nothing stored."""
    audio = ogg_opus(3, tag=b"slow")
    stt.add(audio, "你好")
    stt.trickle(2.0, 60)
    async with _harness(tmp_path, stt, ethan_stt_timeout=3.0) as h:
        h.model.responder = lambda req: Text("好的。")
        t0 = time.perf_counter()
        ev = await _voice(h, audio, 3)
        reply = await reply_to(h, ev, 150)
        took = time.perf_counter() - t0
        await h.idle()
        assert "语音识别服务暂时不可用" in reply.text, reply.text
        line = refused_line(logs, ev)
        assert line["reason"] == "stt_unreachable" and "3 s" in line["detail"], line
        assert took < 15, took                  # the deadline (3 s) plus the audio's fetch and probe
        assert stt.sent < 10                    # the rest of the trickle was never waited for
        await _nothing_kept(h, ev)
