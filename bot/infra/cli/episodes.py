"""``ethan episodes list|search``: one user's episodes (layer 4), as recall ranks them.

Apart from the other subcommands: one command family, read-only.
"""

from __future__ import annotations

import argparse

from bot.core.text import short
from bot.infra.cli.runner import EXIT_OK, SHOW_CHARS, CliError, _open, _user
from bot.infra.config import Settings

async def _episodes_list(settings: Settings, args: argparse.Namespace) -> int:
    from memory.episodes.store import EpisodeStore

    user = _user(args.user)
    db = await _open(settings)
    try:
        eps = await EpisodeStore(db).list(user, limit=args.limit)
    finally:
        await db.close()
    if not eps:
        print(f"no episodes for {user}")
    for e in eps:
        _print_episode(e)
    return EXIT_OK


async def _episodes_search(settings: Settings, args: argparse.Namespace) -> int:
    from memory.episodes.store import EpisodeStore

    user = _user(args.user)
    query = " ".join(args.query).strip()
    if not query:
        raise CliError("ethan: empty query: type a word or phrase to search for")
    db = await _open(settings)
    try:
        eps = await EpisodeStore(db).search(user, query, limit=args.limit)
    finally:
        await db.close()
    if not eps:
        print(f"no episode of {user} matches {query!r}")
    for e in eps:
        _print_episode(e, score=True)
    return EXIT_OK


def _print_episode(e, *, score: bool = False) -> None:
    where = "p2p" if e.visibility == "private" else f"group {e.chat_id}"
    extra = f"  score {e.score:.3f}" if score else ""
    print(f"#{e.id}  {e.date}  {e.session_id}  ({where}, {e.turn_count} turns){extra}")
    print(f"    {short(e.summary, SHOW_CHARS)}")


EPISODE_ACTIONS = {"list": _episodes_list, "search": _episodes_search}
