"""Speech to text: the port voice messages go through (bot/attachments.py).

One implementation, because one wire covers what a Feishu team runs: the OpenAI-compatible
``POST /v1/audio/transcriptions`` (multipart ``file`` + ``model``), spoken by OpenAI
(``whisper-1``, ``gpt-4o-mini-transcribe``), Groq (``whisper-large-v3-turbo``), a vLLM server
with a Whisper model, and local servers — speaches (formerly faster-whisper-server) and the
whisper.cpp server (``--inference-path /v1/audio/transcriptions``). Through the real ``openai``
client, so the multipart form is the SDK's, not ours.

Settings: ``ETHAN_STT_MODEL`` (empty: no speech to text, voice is answered politely),
``ETHAN_STT_BASE_URL`` / ``ETHAN_STT_API_KEY`` (default: ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``), ``ETHAN_STT_MAX_SECONDS``, ``ETHAN_STT_TIMEOUT``.
"""

from __future__ import annotations

from typing import Protocol


class SpeechError(Exception):
    """The transcription failed: ``reason`` is ``unreachable`` (the server down, a timeout, a
    rate limit: may pass) or ``refused`` (the server will not take this audio or this key)."""

    def __init__(self, reason: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.status = reason, detail, status


class Transcriber(Protocol):
    max_seconds: float

    async def transcribe(self, audio: bytes, *, filename: str, media_type: str) -> str: ...


class OpenAICompatibleTranscriber:
    def __init__(self, *, model: str, base_url: str, api_key: str, timeout: float = 60.0,
                 max_seconds: float = 300.0) -> None:
        from bot.llm.openai_model import make_client

        self.model = model
        self.max_seconds = max_seconds
        self.base_url = base_url
        self._client = make_client(api_key=api_key, base_url=base_url or None, stall_timeout=timeout)

    async def transcribe(self, audio: bytes, *, filename: str, media_type: str) -> str:
        import openai   # here, not at module top: `ethan serve` starts without the SDK's ~1 s import

        try:
            got = await self._client.audio.transcriptions.create(
                model=self.model, file=(filename, audio, media_type), response_format="json")
        except openai.APIStatusError as e:
            transient = e.status_code == 429 or e.status_code >= 500
            raise SpeechError("unreachable" if transient else "refused", str(e.message)[:200],
                              e.status_code) from None
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise SpeechError("unreachable", type(e).__name__) from None
        text = getattr(got, "text", got if isinstance(got, str) else "")
        return str(text or "").strip()

    async def aclose(self) -> None:
        await self._client.close()


def from_settings(s) -> OpenAICompatibleTranscriber | None:
    """The configured transcriber, or None (no ``ETHAN_STT_MODEL``)."""
    if not s.ethan_stt_model:
        return None
    return OpenAICompatibleTranscriber(
        model=s.ethan_stt_model, base_url=s.ethan_stt_base_url or s.openai_base_url,
        api_key=s.ethan_stt_api_key or s.openai_api_key, timeout=s.ethan_stt_timeout,
        max_seconds=s.ethan_stt_max_seconds)
