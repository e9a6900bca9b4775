"""The model port: what Ethan asks of any chat model, in neutral types.

Every caller (the agent's tool loop, the consolidator) builds a ``ModelRequest`` and gets a
``ModelResponse``; adapters translate to one vendor's wire format (``bot/llm/``: Anthropic
Messages, OpenAI-compatible Chat Completions, the offline model). Nothing here imports a
vendor SDK, so ``memory/`` stays usable on its own.

Content is plain JSON-able dicts (what is stored in ``messages.tool_calls`` and replayed on
either provider), typed below:

- ``{"type": "text", "text": str, "cache"?: True}``
- ``{"type": "image", "media_type": str, "data": base64 str}``  (or ``"ref"`` to re-fetch)
- ``{"type": "tool_use", "id": str, "name": str, "input": dict}``
- ``{"type": "tool_result", "tool_use_id": str, "content": str, "is_error"?: bool}``

``"cache": True`` on a system block or on the last block of a message marks a prompt-cache
breakpoint *after* it (Anthropic: ``cache_control``; providers that cache prefixes by
themselves ignore it). A message's ``content`` may also be a plain string.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, NotRequired, Protocol, TypedDict


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str
    cache: NotRequired[bool]


class ImageBlock(TypedDict):
    type: Literal["image"]
    media_type: str
    data: NotRequired[str]
    ref: NotRequired[str]


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str
    is_error: NotRequired[bool]


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock


class Message(TypedDict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class StopReason(str, enum.Enum):
    """Why a model turn ended, the same on every provider (adapters map theirs onto these)."""

    END_TURN = "end_turn"
    STOP_SEQUENCE = "stop_sequence"
    MAX_TOKENS = "max_tokens"
    CONTEXT_EXCEEDED = "model_context_window_exceeded"
    TOOL_USE = "tool_use"
    PAUSE_TURN = "pause_turn"
    REFUSAL = "refusal"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one call. ``input_tokens`` counts only the uncached input; the prompt's
    whole size is ``input_tokens + cache_read_tokens + cache_write_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.cache_read_tokens + other.cache_read_tokens,
                     self.cache_write_tokens + other.cache_write_tokens)

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Ask for one JSON object of this schema (the consolidator's ``write_summary`` /
    ``extract_memories``); the adapter picks a forced tool call, a JSON-schema response
    format or a plain instruction, whichever the model accepts (``memory.models.caps``)."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    system: list[TextBlock]
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 2048
    structured: StructuredOutput | None = None
    temperature: float | None = None   # sent only where the model accepts sampling parameters (caps)


@dataclass(frozen=True, slots=True)
class ModelResponse:
    content: list[Block]
    stop_reason: StopReason
    model: str
    provider: str = ""
    usage: Usage = Usage()
    structured: dict[str, Any] | None = None   # the parsed object when ``request.structured`` was set

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if b.get("type") == "tool_use"]  # type: ignore[misc]


class ModelFailure(Exception):
    """A call that produced no usable answer. ``kind`` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, detail: str = "", status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.retry_after = retry_after


FAILURE_KINDS = ("rate_limited", "spend_limit", "overloaded", "server", "timeout", "connection",
                 "bad_request", "auth", "not_found")
# What the next model of a fallback chain may answer instead (never a bad request or a spend limit).
FALLBACK_KINDS = frozenset({"rate_limited", "overloaded", "server", "timeout", "connection"})

OnText = Callable[[str], Awaitable[None]]


class ChatModel(Protocol):
    name: str        # the model id sent on the wire
    provider: str    # the configured provider's name ("anthropic", "openai", a config.yaml name)

    async def turn(self, request: ModelRequest, *, on_text: OnText | None = None,
                   deadline: float) -> ModelResponse:
        """One call, streamed when ``on_text`` is given; raises ModelFailure. ``deadline`` is
        a ``time.monotonic()`` instant the call must not outlive."""
        ...
