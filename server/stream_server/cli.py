"""``durable-streams-server``: the command line."""

from __future__ import annotations

import argparse
import sys

from stream_server import __version__
from stream_server.config import add_arguments, settings_from


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="durable-streams-server",
        description="Durable Streams protocol server (LMDB + append-only logs).",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    add_arguments(serve)
    rotate = sub.add_parser(
        "rotate-webhook-key",
        help="make a new webhook signing key in --data-dir (the old one stays in the JWKS "
        "for --webhook-key-replay-window)",
    )
    add_arguments(rotate)
    args = parser.parse_args(argv)
    try:
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
        parser.error(str(exc))
    if args.command == "serve":
        return serve(settings)
    return rotate_command(settings.data_dir, settings.webhook_key_replay_window)


if __name__ == "__main__":
    sys.exit(main())
