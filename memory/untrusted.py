"""Third-party material in stored turns: how memory recognises it.

Text that is not the speaker's own words (a forwarded message, a file's text, a quoted
message, a tool result) is stored inside the user's turn exactly as the model read it:
``<untrusted_content kind="…" source="…" author="…" time="…">escaped text</untrusted_content>``
(written by ``bot.agent.prompt.fence_material``). Its text and attributes are escaped, so the
material can neither close its fence nor forge one; a replay therefore shows it fenced, and
the consolidator finds it here: fact and profile extraction drop it (a fact about the user
comes from the user), transcripts mark it as third-party.
"""

from __future__ import annotations

import html
import re

TAG = "untrusted_content"

# attributes and body are escaped by the writer: no '>' inside the tag, no '<' in the body
FENCE = re.compile(r"<untrusted_content\b([^>]*)>(.*?)(?:</untrusted_content>|\Z)", re.DOTALL)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def strip(text: str) -> str:
    """``text`` without any fenced material (what the speaker themselves wrote)."""
    return FENCE.sub("", text)


def _marked(m: re.Match, limit: int) -> str:
    attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group(1))}
    body = " / ".join(line.strip() for line in html.unescape(m.group(2)).splitlines() if line.strip())
    if len(body) > limit:
        body = body[:limit] + "…"
    by = f" written by {attrs['author']}" if attrs.get("author") else ""
    return (f"(third-party {attrs.get('kind', 'material')}{by} — shown by the speaker, "
            f"not the speaker's own words: {body})")


def mark_third_party(text: str, *, limit: int = 600) -> str:
    """``text`` with each fenced material replaced by one line saying it is third-party."""
    return FENCE.sub(lambda m: _marked(m, limit), text)
