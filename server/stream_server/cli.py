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
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.command == "serve":
        try:
            from stream_server.server import serve as run
        except ModuleNotFoundError as exc:
            # Installed without the server's dependencies (the package's other extras
            # share this distribution): say what to install instead of a traceback.
            print(
                f"durable-streams-server: {exc.name} is not installed; the server needs the "
                "'server' extra: pip install 'durable-streams-py[server]'",
                file=sys.stderr,
            )
            return 2
        return run(settings)
    return 2


if __name__ == "__main__":
    sys.exit(main())
