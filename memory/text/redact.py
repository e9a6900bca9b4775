"""Recognise credentials in text, so memory never stores them.

``looks_like_secret(text)`` answers whether a text contains something that looks like a
credential; ``redact(text)`` returns the text with each one replaced by ``[redacted]``
(for ``key: value`` statements only the value is replaced, so the sentence stays readable).

What counts as a secret (each rule is one entry of ``_RULES`` below):

* vendor API keys by their published shapes: Anthropic/OpenAI ``sk-…``/``sk-ant-…``,
  AWS access key ids ``AKIA…``/``ASIA…``, GitHub ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``
  and ``github_pat_``, Slack ``xoxb-``/``xoxp-``/…, Google ``AIza…``, Stripe ``sk_live_``/``rk_live_``;
* ``Bearer <token>`` and ``Authorization: Basic <token>``;
* JWTs (``eyJ….eyJ….<sig>``);
* PEM private key blocks (``-----BEGIN … PRIVATE KEY-----`` through the matching END line,
  or to the end of the text when the END line is missing);
* incoming-webhook URLs that are credentials by themselves (Slack ``hooks.slack.com/services/…``,
  Lark/Feishu ``/open-apis/bot/v2/hook/…``);
* stated credentials: ``password: x`` / ``pwd=x`` / ``api_key=x`` / ``token: x`` / ``app_secret=x``
  (any value of 3+ visible ASCII characters), ``my password is x`` (value must contain a digit
  or a symbol, or be quoted — so "the password is required" is not a secret), and Chinese
  ``密码是 x`` / ``密码：x`` / ``口令为 x`` / ``密钥 = x`` (value must be visible ASCII, so
  "密码是什么" is not a secret);
* long high-entropy tokens outside URLs: a run of 24+ characters from
  ``[A-Za-z0-9_+/=-]`` that mixes letters and digits, is not pure hex (commit hashes, UUIDs and
  Lark ids are hex), does not start with a Lark id prefix (``ou_``, ``oc_``, ``on_``, ``om_``,
  ``cli_`` …), has a Shannon entropy of at least ``ENTROPY_BITS`` bits per character, and is
  not word-like (word-like = its camelCase/snake_case/digit pieces average 3+ characters and
  at least a quarter of its letters are vowels: ``getUserProfileById2``,
  ``claude-sonnet-4-5-20250929``, ``x86_64-unknown-linux-gnu``). Random base62 tokens of 32
  characters are caught ~99 % of the time, lower-case-and-digit ones ~93 %.

Ordinary Chinese and English sentences, URLs, e-mail addresses, Lark open/chat/message ids,
UUIDs and commit hashes are not secrets. The detector is deliberately conservative about
plain-word passwords ("my password is hunter" is not caught; "password: hunter" is).
"""

from __future__ import annotations

import math
import re
from collections import Counter

REDACTED = "[redacted]"
ENTROPY_BITS = 3.5
MIN_TOKEN_LEN = 24

# (compiled pattern, name of the group to replace or None for the whole match)
_RULES: list[tuple[re.Pattern[str], str | None]] = []


def _rule(pattern: str, group: str | None = None, flags: int = 0) -> None:
    _RULES.append((re.compile(pattern, flags), group))


_B = r"(?<![A-Za-z0-9_\-])"   # token start boundary (``\b`` treats '-' as a boundary)
_E = r"(?![A-Za-z0-9_\-])"

# vendor key shapes
_rule(_B + r"sk-ant-[A-Za-z0-9_\-]{16,}")
_rule(_B + r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")
_rule(_B + r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}")
_rule(_B + r"(?:AKIA|ASIA|AIDA|AROA)[0-9A-Z]{16}" + _E)
_rule(_B + r"gh[pousr]_[A-Za-z0-9]{30,}")
_rule(_B + r"github_pat_[A-Za-z0-9_]{22,}")
_rule(_B + r"xox[abposr]-[A-Za-z0-9\-]{10,}")
_rule(_B + r"AIza[0-9A-Za-z_\-]{35}")
# tokens in headers
_rule(r"(?i)\bbearer\s+(?P<v>[A-Za-z0-9\-._~+/]{12,}=*)", "v")
_rule(r"(?i)\bauthorization\s*[:=]\s*(?:basic|token|digest)?\s*(?P<v>[A-Za-z0-9\-._~+/]{8,}=*)", "v")
# JWT: header.payload.signature, header and payload are base64url JSON objects
_rule(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")
# PEM private keys
_rule(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
    None,
    re.DOTALL,
)
# webhook URLs that carry their own credential
_rule(r"(?i)hooks\.slack\.com/services/(?P<v>[A-Za-z0-9/_\-]{16,})", "v")
_rule(r"(?i)/open-apis/bot/v2/hook/(?P<v>[A-Za-z0-9\-]{16,})", "v")

# stated credentials, English: key [:=] value (any visible ASCII value of 3+ chars)
_KEY_NAMES = (
    r"pass(?:word|wd|phrase|code)|pwd|secret|client[_\- ]?secret|app[_\- ]?secret|"
    r"api[_\- ]?key|apikey|access[_\- ]?key(?:[_\- ]?id)?|secret[_\- ]?key|private[_\- ]?key|"
    r"(?:access|auth|refresh|api|bot|app)?[_\- ]?token|encrypt[_\- ]?key|verification[_\- ]?token"
)
_rule(r"(?i)(?<![A-Za-z0-9])(?:" + _KEY_NAMES + r")\s*[:=：]\s*(?P<v>[!-~]{3,})", "v")
# "my password is x": x must look like a password (contain a digit or symbol), or be quoted
_rule(
    r"(?i)\b(?:pass(?:word|wd|phrase|code)|pwd|pin)\s+(?:is|was)\s+"
    r"(?P<v>[\"'`][^\"'`\s]{3,}[\"'`]|(?=[!-~]*[0-9#$%&*@^~_+=])[!-~]{4,})",
    "v",
)
# stated credentials, Chinese: 密码是/为/:/= value (value: visible ASCII)
_rule(r"(?:密码|口令|密钥|秘钥|私钥|令牌|PIN码|pin码)\s*(?:是|为|[:：=])\s*(?P<v>[!-~]{3,})", "v")

_LEADING = "'\"`([{<"
_TRAILING = ".,;:!?)]}>'\"`"

_URL = re.compile(r"(?i)(?<![A-Za-z0-9])(?:https?|ftp|wss?)://[^\s<>\"'，。]+")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_+/=\-])[A-Za-z0-9_+/=\-]{%d,}" % MIN_TOKEN_LEN)
_HEX = re.compile(r"[0-9a-fA-F\-]+")
_PIECES = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_LARK_ID = re.compile(r"^(?:ou|oc|on|om|og|ot|omt|cli|img|file|tenant|uid|union)_", re.I)


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _word_like(token: str) -> bool:
    """Identifiers and words (camelCase, snake_case, paths, model names), not random strings."""
    pieces = _PIECES.findall(token)
    if not pieces:
        return False
    mean = sum(map(len, pieces)) / len(pieces)
    letters = [c for c in token.lower() if c.isalpha()]
    vowels = sum(c in "aeiouy" for c in letters) / max(1, len(letters))
    return mean >= 3 and vowels >= 0.25


def _high_entropy(token: str) -> bool:
    body = token.strip("=-_")
    if len(body) < MIN_TOKEN_LEN or _LARK_ID.match(body) or _HEX.fullmatch(body):
        return False
    if not (any(c.isdigit() for c in body) and any(c.isalpha() for c in body)):
        return False
    return _entropy(body) >= ENTROPY_BITS and not _word_like(body)


def _spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for pattern, group in _RULES:
        for m in pattern.finditer(text):
            a, b = m.span(group) if group else m.span()
            if group == "v":
                while b - a > 3 and text[a] in _LEADING and not text.startswith(REDACTED, a):
                    a += 1
                if text.startswith(REDACTED, a):
                    continue  # already redacted: "password: [redacted]"
                while b - a > 3 and text[b - 1] in _TRAILING:
                    b -= 1  # "password: 'abc123'." -> the value is abc123
            if b > a:
                spans.append((a, b))
    urls = [m.span() for m in _URL.finditer(text)]
    for m in _TOKEN.finditer(text):
        a, b = m.span()
        if any(ua <= a < ub for ua, ub in urls):
            continue
        if _high_entropy(m.group()):
            spans.append((a, b))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def looks_like_secret(text: str) -> bool:
    """True when ``text`` contains something that looks like a credential."""
    return bool(text) and bool(_spans(text))


def redact(text: str) -> str:
    """``text`` with every credential replaced by ``[redacted]``."""
    if not text:
        return text
    out = text
    for a, b in reversed(_spans(text)):
        out = out[:a] + REDACTED + out[b:]
    return out
