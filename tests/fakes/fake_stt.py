"""A fake OpenAI-compatible speech-to-text server: ``POST /v1/audio/transcriptions``.

What OpenAI, Groq, speaches (faster-whisper-server), whisper.cpp's server and vLLM take:
a multipart form with ``file`` (the audio, with its filename and content type) and ``model``,
``response_format`` json → ``{"text": …}``. The fake checks the bearer key when given one,
records every request (model, filename, content type, the bytes), and answers from
``transcripts`` keyed by the audio's bytes (``add``) — unknown audio: ``default``.
``fail_next(status)`` answers one request with an OpenAI-shaped error. Hostile servers
(issue 45, N9): a transcript of any length (``add``; the body is UTF-8 JSON, not ``\\u``
escapes, as OpenAI sends it), and ``trickle(every, n)``: the answer's headers at once, then
one byte every ``every`` seconds (``n`` spaces before the JSON, which JSON allows); ``sent``
counts the body bytes written (a large body in 64 KB pieces, each after the socket took the last).

    with FakeSTT(api_key="sk-stt") as stt:
        stt.add(audio_bytes, "明天下午三点开会")
        # ETHAN_STT_MODEL=whisper-1 ETHAN_STT_BASE_URL=stt.base_url ETHAN_STT_API_KEY=sk-stt
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import threading
from dataclasses import dataclass

from aiohttp import web

from .fake_lark import ThreadedAiohttpServer


@dataclass
class Transcription:
    model: str
    filename: str
    content_type: str
    data: bytes
    response_format: str
    authorization: str


class FakeSTT(ThreadedAiohttpServer):
    def __init__(self, *, api_key: str | None = None, default: str = "") -> None:
        super().__init__()
        self.api_key = api_key
        self.default = default
        self.requests: list[Transcription] = []
        self._texts: dict[str, str] = {}
        self._fail: list[int] = []
        self._trickle: tuple[float, int] | None = None
        self.sent = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:   # what ETHAN_STT_BASE_URL is set to (the SDK appends /audio/…)
        return super().base_url + "/v1"

    def add(self, audio: bytes, text: str) -> None:
        with self._lock:
            self._texts[hashlib.sha256(audio).hexdigest()] = text

    def fail_next(self, status: int) -> None:
        with self._lock:
            self._fail.append(status)

    def trickle(self, every: float, n: int = 60) -> None:
        with self._lock:
            self._trickle = (every, n)

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/audio/transcriptions", self._h_transcribe)
        return app

    @staticmethod
    def _error(status: int, message: str, etype: str = "invalid_request_error") -> web.Response:
        return web.json_response({"error": {"message": message, "type": etype, "param": None,
                                            "code": None}}, status=status)

    async def _h_transcribe(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            return self._error(401, "Incorrect API key provided.")
        if not request.content_type.startswith("multipart/form-data"):
            return self._error(400, "Expected multipart/form-data")
        fields: dict[str, str] = {}
        audio, filename, ctype = b"", "", ""
        reader = await request.multipart()
        async for part in reader:
            if part.name == "file":
                filename, ctype = part.filename or "", part.headers.get("Content-Type", "")
                audio = bytes(await part.read())
            else:
                fields[part.name or ""] = await part.text()
        if not audio or not filename or not fields.get("model"):
            return self._error(400, "file and model are required")
        rec = Transcription(fields["model"], filename, ctype, audio,
                            fields.get("response_format", "json"), auth)
        with self._lock:
            self.requests.append(rec)
            fail = self._fail.pop(0) if self._fail else 0
            text = self._texts.get(hashlib.sha256(audio).hexdigest(), self.default)
        if fail:
            return self._error(fail, "fake failure", "server_error" if fail >= 500 else "invalid_request_error")
        if rec.response_format == "text":
            return web.Response(text=text, content_type="text/plain")
        body = json.dumps({"text": text}, ensure_ascii=False).encode()
        if self._trickle is None and len(body) <= 1 << 20:
            self.sent += len(body)
            return web.json_response(body=body)
        # Large or slow: written in pieces, each waiting for the socket, so ``sent`` stops near
        # where the client stopped reading (plus the sockets' buffers).
        every, n = self._trickle or (0.0, 0)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            if not n:
                for i in range(0, len(body), 1 << 16):
                    await resp.write(body[i:i + (1 << 16)])
                    self.sent += len(body[i:i + (1 << 16)])
                await resp.write_eof()
                return resp
            for _ in range(n):
                await resp.write(b" ")
                self.sent += 1
                await asyncio.sleep(every)
            await resp.write(body)
            self.sent += len(body)
            await resp.write_eof()
        except ConnectionError:
            pass                         # the client hung up: what it was waiting for
        return resp


# -- audio the tests send ------------------------------------------------------------------------

def _ogg_crc(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _ogg_page(payload: bytes, *, granule: int, seq: int, flags: int, serial: int = 0x45746861) -> bytes:
    segs, n = [], len(payload)
    while n >= 255:
        segs.append(255)
        n -= 255
    segs.append(n)
    head = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, seq, 0, len(segs)) + bytes(segs)
    page = head + payload
    crc = _ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def ogg_opus(seconds: float, *, tag: bytes = b"") -> bytes:
    """A well-formed Ogg Opus stream of ``seconds`` (Lark's voice format): OpusHead, OpusTags,
    then one page per second of (silent) 20 ms frames. ``tag`` makes the bytes unique."""
    pre_skip = 312
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, pre_skip, 16000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 5) + b"ethan" + struct.pack("<I", 1 if tag else 0)
    if tag:
        tags += struct.pack("<I", len(tag) + 4) + b"tag=" + tag
    pages = [_ogg_page(head, granule=0, seq=0, flags=2), _ogg_page(tags, granule=0, seq=1, flags=0)]
    whole = max(1, int(seconds + 0.999))
    for i in range(whole):
        frames = b"".join(b"\xf8\xff\xfe" for _ in range(50))   # 50 silent 20 ms frames
        granule = pre_skip + int(min(seconds, i + 1) * 48_000)
        pages.append(_ogg_page(frames, granule=granule, seq=2 + i, flags=4 if i == whole - 1 else 0))
    return b"".join(pages)
