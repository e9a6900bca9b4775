"""The log scrubber hides secrets but not token counts (it once printed input_tokens as
"[redacted]" because the key contains "token")."""

from bot.log import _scrub


def test_secrets_hidden_token_counts_kept():
    line = _scrub(None, "info", {"event": "agent.replied", "input_tokens": 754, "cache_read_tokens": 0,
                                 "api_token": "t-" + "a" * 40, "note": "key sk-ant-abcdefgh123"})
    assert line["input_tokens"] == 754 and line["cache_read_tokens"] == 0
    assert line["api_token"] == "[redacted]"
    assert "sk-ant-" not in line["note"]
