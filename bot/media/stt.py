"""Speech to text: the port voice messages go through (bot/media/attachments.py).

One implementation, because one wire covers what a Feishu team runs: the OpenAI-compatible
``POST /v1/audio/transcriptions`` (multipart ``file`` + ``model``), spoken by OpenAI
(``whisper-1``, ``gpt-4o-mini-transcribe``), Groq (``whisper-large-v3-turbo``), a vLLM server
with a Whisper model, and local servers — speaches (formerly faster-whisper-server) and the
whisper.cpp server (``--inference-path /v1/audio/transcriptions``). Through the real ``openai``
client, so the multipart form is the SDK's, not ours.

Settings: ``ETHAN_STT_MODEL`` (empty: no speech to text, voice is answered politely),
``ETHAN_STT_BASE_URL`` / ``ETHAN_STT_API_KEY`` (default: ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``), ``ETHAN_STT_MAX_SECONDS``, ``ETHAN_STT_TIMEOUT``.

The server's answer is untrusted (issue 45, N9): ``ETHAN_STT_TIMEOUT`` is a deadline for the
whole call — upload, wait, every byte of the answer — not only for one silent read (a server
sending a byte every 2 s passed a 5 s read timeout for a minute); and the answer is read with
a byte cap and held to ``max_chars`` (the caller's bound for the audio's length,
``transcript_cap``): a 3-second message "transcribed" as 20 M characters is refused, never
read whole, stored or echoed.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Protocol

# Fast speech is ~5 Chinese characters or ~15 English characters a second; Whisper's own
# ceiling is 448 tokens per 30 s window. 25 a second plus a margin for short messages is
# several times any real transcript and small enough that a runaway one is refused.
TRANSCRIPT_CHARS_PER_SECOND = 25
TRANSCRIPT_CHARS_BASE = 200


def transcript_cap(seconds: float) -> int:
    """The most characters a transcript of ``seconds`` of audio may have."""
    return TRANSCRIPT_CHARS_BASE + TRANSCRIPT_CHARS_PER_SECOND * math.ceil(max(seconds, 0.0))


def body_cap(max_chars: int) -> int:
    # JSON may escape every character as \uXXXX (6 bytes; 12 for a surrogate pair, 2 chars);
    # plus room for the other fields a server adds (usage, language, duration).
    return 6 * max_chars + 4096


class SpeechError(Exception):
    """The transcription failed: ``reason`` is ``unreachable`` (the server down, a timeout, a
    rate limit: may pass), ``refused`` (the server will not take this audio or this key) or
    ``too_long`` (an answer past ``max_chars``: not a transcript of this audio)."""

    def __init__(self, reason: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.status = reason, detail, status


class Transcriber(Protocol):
    max_seconds: float

    async def transcribe(self, audio: bytes, *, filename: str, media_type: str, max_chars: int) -> str: ...


class OpenAICompatibleTranscriber:
    def __init__(self, *, model: str, base_url: str, api_key: str, timeout: float = 60.0,
                 max_seconds: float = 300.0) -> None:
        from bot.llm.openai_model import make_client

        self.model = model
        self.max_seconds = max_seconds
        self.base_url = base_url
        self.timeout = timeout
        self._client = make_client(api_key=api_key, base_url=base_url or None, stall_timeout=timeout)

    async def transcribe(self, audio: bytes, *, filename: str, media_type: str, max_chars: int) -> str:
        import openai   # here, not at module top: `ethan serve` starts without the SDK's ~1 s import

        cap = body_cap(max_chars)
        try:
            async with asyncio.timeout(self.timeout):
                # Streamed, so the body is ours to read and stop reading: the SDK's parse would
                # take all of it first.
                async with self._client.audio.transcriptions.with_streaming_response.create(
                        model=self.model, file=(filename, audio, media_type), response_format="json") as got:
                    body = bytearray()
                    async for chunk in got.iter_bytes():
                        body += chunk
                        if len(body) > cap:
                            raise SpeechError("too_long", f"answer past {cap} bytes")
        except openai.APIStatusError as e:
            transient = e.status_code == 429 or e.status_code >= 500
            raise SpeechError("unreachable" if transient else "refused", str(e.message)[:200],
                              e.status_code) from None
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise SpeechError("unreachable", type(e).__name__) from None
        except TimeoutError:
            raise SpeechError("unreachable", f"no whole answer within {self.timeout:g} s") from None
        except SpeechError:
            raise
        except Exception as e:  # noqa: BLE001 - the transport failing mid-body (reset, stalled read)
            raise SpeechError("unreachable", f"{type(e).__name__}: {e}"[:200]) from None
        text = _text_of(bytes(body))
        if len(text) > max_chars:
            raise SpeechError("too_long", f"{len(text)} characters, at most {max_chars}")
        return text

    async def aclose(self) -> None:
        await self._client.close()


def _text_of(body: bytes) -> str:
    """``{"text": …}`` (response_format json); a server answering plain text is taken as is."""
    raw = body.decode("utf-8", errors="replace")
    try:
        got = json.loads(raw)
    except ValueError:
        return raw.strip()
    text = got.get("text") if isinstance(got, dict) else got if isinstance(got, str) else ""
    return str(text or "").strip()


def from_settings(s) -> OpenAICompatibleTranscriber | None:
    """The configured transcriber, or None (no ``ETHAN_STT_MODEL``)."""
    if not s.ethan_stt_model:
        return None
    return OpenAICompatibleTranscriber(
        model=s.ethan_stt_model, base_url=s.ethan_stt_base_url or s.openai_base_url,
        api_key=s.ethan_stt_api_key or s.openai_api_key, timeout=s.ethan_stt_timeout,
        max_seconds=s.ethan_stt_max_seconds)
