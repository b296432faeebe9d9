"""``durable-streams-server``: the command line.

``serve`` takes every setting (``config/declaration.py``); ``rotate-webhook-key`` only the two it
uses; ``settings`` prints the settings' table (the README's is generated from
it, and a test keeps the two equal). Every command reads the ``DS_*``
variables too, and refuses a bad value, naming the setting, before it touches
the data directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stream_server import __version__
from stream_server.archive import commands as archive_commands
from stream_server.config import SettingError, add_arguments, settings_from

ROTATE_SETTINGS = ("data_dir", "webhook_key_replay_window")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="durable-streams-server",
        description="Durable Streams protocol server (LMDB + append-only logs).",
    )
    top.add_argument("--version", action="version", version=__version__)
    sub = top.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("serve", help="run the HTTP server"))
    add_arguments(
        sub.add_parser(
            "rotate-webhook-key",
            help="make a new webhook signing key in --data-dir (the old one stays in the JWKS "
            "for --webhook-key-replay-window)",
        ),
        only=ROTATE_SETTINGS,
    )
    archive_commands.add_commands(sub)  # backup, backups list|prune, restore
    # A worker process of ``serve --workers N``: started by the writer, never by hand.
    sub.add_parser("worker")
    table = sub.add_parser("settings", help="print every setting as a Markdown table")
    table.add_argument("--markdown", action="store_true", help="as Markdown (the default)")
    table.add_argument(
        "--check",
        metavar="FILE",
        type=Path,
        help="exit 1 unless FILE's settings table is the generated one",
    )
    table.add_argument(
        "--write", metavar="FILE", type=Path, help="replace FILE's settings table with it"
    )
    return top


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command == "settings":
        from stream_server.config.table import command

        return command(args.check, args.write)
    if args.command == "worker":
        from stream_server.workers.processes import serve_worker

        return serve_worker()
    try:
        if args.command in archive_commands.COMMANDS:  # backup, backups, restore
            return archive_commands.run(args)
        # Checking the settings imports the parsers of retention rules and webhook
        # addresses, which need the server's dependencies too.
        settings = settings_from(args)
        from stream_server.server import serve
        from stream_server.subscriptions.signing import rotate_command
    except ModuleNotFoundError as exc:
        # Installed without the server's dependencies (the package's other extras
        # share this distribution): say what to install instead of a traceback.
        print(
            f"durable-streams-server: {exc.name} is not installed; the server needs the "
            "'server' extra: pip install 'durable-streams-py[server]'",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:
        p.error(str(exc))
    if args.command == "serve":
        try:
            return serve(settings)
        except SettingError as exc:  # the port or the address, found when it is bound
            print(f"{p.prog}: error: {exc}", file=sys.stderr)
            return 2
    return rotate_command(settings.data_dir, settings.webhook_key_replay_window)


if __name__ == "__main__":
    sys.exit(main())
