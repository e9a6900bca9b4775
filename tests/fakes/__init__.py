"""Wire-level fakes for tests: a fake Lark Open API, a fake Anthropic Messages API (both real
HTTP servers on 127.0.0.1, each on its own thread and loop), and Lark event builders.

    from tests.fakes import FakeLark, FakeAnthropic, Text, ToolUse, Error, make_text_event
"""

from .fake_anthropic import (
    Delay,
    Error,
    FakeAnthropic,
    Json,
    RecordedRequest,
    Stall,
    Text,
    ToolUse,
    Turn,
)
from .fake_lark import (
    Call,
    CardState,
    FakeLark,
    SentMessage,
    chat_rate_limited,
    rate_limited,
    server_error,
    token_invalid,
)
from .lark_events import (
    decrypt,
    encrypt,
    load_fixture,
    make_text_event,
    sign,
    url_verification,
    webhook_request,
)

__all__ = [
    "Call",
    "CardState",
    "Delay",
    "Error",
    "FakeAnthropic",
    "FakeLark",
    "Json",
    "RecordedRequest",
    "SentMessage",
    "Stall",
    "Text",
    "ToolUse",
    "Turn",
    "chat_rate_limited",
    "decrypt",
    "encrypt",
    "load_fixture",
    "make_text_event",
    "rate_limited",
    "server_error",
    "sign",
    "token_invalid",
    "url_verification",
    "webhook_request",
]
