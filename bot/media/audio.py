"""What a voice message's bytes are, and how long they play: read in a parse worker
(bot/media/parse_worker.py job ``audio``), never on the event loop — the bytes are the sender's.

The container is sniffed from its first bytes (the transport's content type and the
message's declared duration are not trusted alone): Ogg (Opus — Lark's voice messages — or
Vorbis) and WAV are measured (last granule position / sample rate; data size / byte rate);
MP3, M4A, WebM, FLAC and AMR are recognised and their length is the declared one, bounded by
the byte cap. Anything else, or an Ogg whose pages do not add up, is ``Refused("unreadable")``:
the user is told briefly, nothing is stored.
"""

from __future__ import annotations

import struct

from bot.media.readers import Refused

MAX_OGG_PAGES = 200_000          # a 25 MB file of minimal pages; a loop bound, not a size check

# format -> (file extension the STT server is told, media type)
FORMATS = {
    "ogg": ("ogg", "audio/ogg"), "wav": ("wav", "audio/wav"), "mp3": ("mp3", "audio/mpeg"),
    "m4a": ("m4a", "audio/mp4"), "webm": ("webm", "audio/webm"), "flac": ("flac", "audio/flac"),
    "amr": ("amr", "audio/amr"),
}


def sniff_audio(data: bytes) -> str:
    if data.startswith(b"OggS"):
        return "ogg"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[4:8] == b"ftyp":
        return "m4a"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    if data.startswith(b"fLaC"):
        return "flac"
    if data.startswith(b"#!AMR"):
        return "amr"
    return ""


def probe(data: bytes) -> dict:
    """``{"format", "ext", "media_type", "seconds"}`` (seconds 0.0: not measured)."""
    fmt = sniff_audio(data)
    if not fmt:
        raise Refused("unreadable", "not an audio container we know", "parser")
    seconds = _ogg_seconds(data) if fmt == "ogg" else _wav_seconds(data) if fmt == "wav" else 0.0
    ext, media_type = FORMATS[fmt]
    return {"format": fmt, "ext": ext, "media_type": media_type, "seconds": seconds}


def _ogg_seconds(data: bytes) -> float:
    pos, pages, first_serial, rate, pre_skip, last = 0, 0, None, 0, 0, 0
    while pos < len(data):
        if data[pos:pos + 4] != b"OggS" or pos + 27 > len(data):
            raise Refused("unreadable", f"broken Ogg page at byte {pos}", "parser")
        pages += 1
        if pages > MAX_OGG_PAGES:
            raise Refused("unreadable", "too many Ogg pages", "parser")
        granule, serial = struct.unpack_from("<qI", data, pos + 6)
        nseg = data[pos + 26]
        table = data[pos + 27:pos + 27 + nseg]
        body = pos + 27 + nseg
        end = body + sum(table)
        if len(table) != nseg or end > len(data):
            raise Refused("unreadable", "truncated Ogg page", "parser")
        if first_serial is None:
            first_serial = serial
            head = data[body:end]
            if head.startswith(b"OpusHead") and len(head) >= 12:
                rate, pre_skip = 48_000, struct.unpack_from("<H", head, 10)[0]
            elif head.startswith(b"\x01vorbis") and len(head) >= 16:
                rate = struct.unpack_from("<I", head, 12)[0]
            else:
                raise Refused("unreadable", "an Ogg stream that is neither Opus nor Vorbis", "parser")
        if serial == first_serial and granule > 0:
            last = granule
        pos = end
    if rate <= 0:
        raise Refused("unreadable", "no sample rate", "parser")
    return max(0.0, (last - pre_skip) / rate)


def _wav_seconds(data: bytes) -> float:
    pos, byte_rate = 12, 0
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if cid == b"fmt " and size >= 16 and pos + 8 + 16 <= len(data):
            byte_rate = struct.unpack_from("<I", data, pos + 16)[0]
        elif cid == b"data":
            if byte_rate <= 0:
                raise Refused("unreadable", "WAV data before its format", "parser")
            return min(size, len(data) - pos - 8) / byte_rate
        pos += 8 + size + (size & 1)
    raise Refused("unreadable", "a WAV file without data", "parser")
