"""The episode record: ``Episode``, how a row of ``episodes`` reads as one, and which rows a
chat may see.

Every part of the episode layer hands episodes around — the store writes and lists them, the
search ranks them, recall picks and fits them — so the record and its row reader are apart
from all of them (below them in the import graph). ``_where`` / ``episode_visibility`` are the
owner and visibility filter every read of the layer applies (DESIGN.md §4).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from memory.scope import Scope


@dataclass(slots=True)
class Episode:
    id: int
    user_id: str
    session_id: str
    chat_id: str
    chat_type: str
    visibility: str
    summary: str
    keywords: list[str]
    model: str
    turn_count: int
    timestamp: float
    started_at: float | None = None
    ended_at: float | None = None
    score: float = 0.0
    matched: list[str] = field(default_factory=list)
    excerpt: str = ""          # recall: the evidence lines joined (older callers read this)
    evidence: list[str] = field(default_factory=list)   # recall: the matching lines with neighbours

    def to_dict(self) -> dict[str, Any]:
        """The spec's record (episodes.json), plus scope and the session's dates."""
        return {
            "session_id": self.session_id,
            "summary": self.summary,
            "timestamp": self.timestamp,
            "model": self.model,
            "turn_count": self.turn_count,
            "keywords": list(self.keywords),
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "visibility": self.visibility,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @property
    def date(self) -> str:
        """The session's day (UTC, YYYY-MM-DD), or its last day when it spans several."""
        ts = self.ended_at or self.started_at or self.timestamp
        return time.strftime("%Y-%m-%d", time.gmtime(ts)) if ts else ""


_COLUMNS = ("id, user_id, session_id, chat_id, chat_type, visibility, summary, keywords, model, turn_count,"
            " timestamp, started_at, ended_at")
_E_COLUMNS = ", ".join("e." + c.strip() for c in _COLUMNS.split(","))


def _row(row: Any, *, score: float = 0.0) -> Episode:
    try:
        keywords = json.loads(row["keywords"] or "[]")
        if not isinstance(keywords, list):
            keywords = []
    except ValueError:
        keywords = []
    return Episode(
        id=row["id"], user_id=row["user_id"], session_id=row["session_id"], chat_id=row["chat_id"],
        chat_type=row["chat_type"], visibility=row["visibility"], summary=row["summary"],
        keywords=[str(k) for k in keywords], model=row["model"], turn_count=row["turn_count"],
        timestamp=row["timestamp"], started_at=row["started_at"], ended_at=row["ended_at"], score=score,
    )


def _where(user_id: str, scope: Scope | None, exclude_session: str | None) -> tuple[list[str], list[Any]]:
    """The owner filter (always), where ``scope`` may see the episode, and the excluded session.

    DESIGN.md §4: an episode of a group session belongs to that group — it holds other
    members' words — so it is seen only in that group (``chat_id``), never in a p2p chat or
    another group; a p2p episode only in p2p. (Facts and profile keep the looser
    ``visible_sql`` rule: they are the user's own words.)"""
    where = ["e.user_id = ?"]
    params: list[Any] = [user_id]
    if scope is not None:
        sql, extra = episode_visibility(scope, "e.")
        where.append(sql)
        params.extend(extra)
    if exclude_session:
        where.append("e.session_id <> ?")
        params.append(exclude_session)
    return where, params


def episode_visibility(scope: Scope, prefix: str = "") -> tuple[str, list[Any]]:
    if scope.is_private:
        return f"{prefix}visibility = 'private'", []
    return f"({prefix}visibility = 'shared' AND {prefix}chat_id = ?)", [scope.chat_id]
