"""Credentials are recognised (and redacted); ordinary text, URLs and Lark ids are not."""

from __future__ import annotations

import pytest

from memory.text.redact import REDACTED, looks_like_secret, redact

SECRETS = [
    "my key is sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789",
    "OPENAI_API_KEY sk-proj-AbCdEfGhIjKlMnOpQrStUvWx12",
    "aws AKIAIOSFODNN7EXAMPLE",
    "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789ab",
    "slack xoxb-123456789012-abcdefghij",
    "Authorization: Bearer abc.def-ghi_jkl123",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "password: hunter2",
    "pwd=abc",
    "db passwd = s3cret!",
    "my password is hunter2!",
    "我的密码是 abc12345",
    "WiFi密码是12345678，记住",
    "密码：P@ssw0rd",
    "服务器口令为 root1234",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
    "app_secret=ZcIHfGa0sCBvB2EuVZiX7bYQKnQrSm3P",
    "the secret is ZcIHfGa0sCBvB2EuVZiX7bYQKnQrSm3P ok",
    "https://open.feishu.cn/open-apis/bot/v2/hook/2f1e4a6b-1234-5678-9abc-def012345678",
    "api_key = 'abcd1234'",
    "callback https://example.com/cb?access_token=Zx81kQ2mP0",
]

NOT_SECRETS = [
    "用户喜欢喝咖啡",
    "User prefers dark mode",
    "密码是什么？",
    "忘记密码了怎么办",
    "用户的密码管理器是 1Password",
    "the password is required",
    "Reset your password: go to settings",
    "see https://github.com/anthropics/anthropic-sdk-python/blob/main/README.md",
    "https://open.feishu.cn/open-apis/im/v1/messages?receive_id_type=chat_id",
    "周报在 https://acme.feishu.cn/docx/Xk9aQ2mB7pL4vR8sT1wZ3yN6cD 里",
    "周报在https://acme.feishu.cn/wiki/Xk9aQ2mB7pL4vR8sT1wZ3yN6cD里",
    "https://docs.google.com/document/d/1aBcD3eFgH4iJkL5mNoP6qRsT7uVwX8yZ/edit",
    "open_id ou_7d8a6e6df7621556ce0d21922b676706 chat oc_a0553eda9014c201e6969b478895c230",
    "message om_dc13264520392913993dd051dba21dcf",
    "app id cli_a1b2c3d4e5f6a7b8",
    "用户的邮箱是 zhang.san@example.com",
    "commit 3f2a9c1e8b7d6a5f4e3c2b1a0f9e8d7c6b5a4f3e",
    "uuid 550e8400-e29b-41d4-a716-446655440000",
    "用户在 Acme Corp 担任后端工程师",
    "User uses claude-sonnet-4-5-20250929 daily",
    "calls getUserProfileByOpenIdAndChatId2 in x86_64-unknown-linux-gnu builds",
    "max tokens 4096",
    "session s_20260611_1753_d139",
    "The API key is stored in the vault",
    "用户的 token 用完了",
    "Always reply in Chinese",
    "",
]


@pytest.mark.parametrize("text", SECRETS)
def test_secrets_are_recognised_and_redacted(text):
    assert looks_like_secret(text)
    out = redact(text)
    assert REDACTED in out
    assert not looks_like_secret(out), out


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_ordinary_text_is_not_a_secret(text):
    assert not looks_like_secret(text)
    assert redact(text) == text


def test_redact_keeps_the_sentence_around_the_value():
    assert redact("password: hunter2.") == "password: [redacted]."
    assert redact("我的密码是 abc12345，别告诉别人") == "我的密码是 [redacted]，别告诉别人"
    assert redact("Authorization: Bearer abcdefghijklmnop1234") == "Authorization: Bearer [redacted]"
    assert redact("use sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123 and AKIAIOSFODNN7EXAMPLE") == (
        "use [redacted] and [redacted]"
    )
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    assert redact(f"session {jwt} expired") == "session [redacted] expired"
    assert redact("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\nafter") == "[redacted]\nafter"
