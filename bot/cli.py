"""The ``ethan`` command (also ``python -m bot``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from bot.config import ConfigError, load_settings
from bot.log import configure_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ethan", description="Ethan: a Lark/Feishu bot with a four-layer memory")
    p.add_argument("-r", "--resume", metavar="ID", help="resume a session in the terminal chat (id, tail, or 'last')")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("serve", help="run the bot: Lark transport, web console, API")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"ethan: configuration error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.ethan_log_level)
    if args.command in (None, "serve") and not args.resume:
        from bot.app import serve

        try:
            asyncio.run(serve(settings))
        except KeyboardInterrupt:
            pass
        except OSError as e:
            print(f"ethan: cannot start: {e}", file=sys.stderr)
            return 1
        return 0
    print("ethan: not implemented yet", file=sys.stderr)
    return 2
