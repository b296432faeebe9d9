"""The archive's commands: ``backup``, ``backups list``, ``backups prune`` and ``restore``
(docs/backup.md). Each prints one JSON document on stdout; a failure prints
``{"error": ...}`` and exits 1.

The object store is given as the server's settings give it (``--archive-url``,
``--archive-endpoint``, ``--archive-region``, ``--archive-ca-bundle``, or their
``DS_ARCHIVE_*`` variables); credentials as the AWS SDKs read them.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_server.config import add_arguments, settings_from
from stream_server.config.checks import parse_backup_retention

if TYPE_CHECKING:
    from stream_server.archive.object_store import ObjectStore

STORE_SETTINGS = ("archive_url", "archive_endpoint", "archive_region", "archive_ca_bundle")
COMMANDS = ("backup", "backups", "restore")


def add_commands(sub: Any) -> None:
    """The commands, on the CLI's subparsers."""
    take = sub.add_parser("backup", help="ask a running server for a base backup now")
    take.add_argument("--server", required=True, help="the server's origin, http://HOST:PORT")
    take.add_argument(
        "--token-file", help="file holding the replica set's token (--replication-token-file)"
    )
    backups = sub.add_parser("backups", help="the base backups in an archive")
    what = backups.add_subparsers(dest="backups_command", required=True)
    add_arguments(
        what.add_parser("list", help="print the backups and the recoverable range"),
        only=STORE_SETTINGS,
    )
    prune = what.add_parser("prune", help="delete the backups a retention policy does not keep")
    add_arguments(prune, only=STORE_SETTINGS)
    prune.add_argument(
        "--keep", required=True, help="7d, 12h (a duration) or last=N; the newest is always kept"
    )
    back = sub.add_parser("restore", help="build a new data directory from the archive")
    add_arguments(back, only=("data_dir", *STORE_SETTINGS))
    back.add_argument("--backup", help="the backup's id (default: the newest before the target)")
    target = back.add_mutually_exclusive_group()
    target.add_argument("--target-time", help="RFC 3339 time: stop before the first frame after it")
    target.add_argument("--target-lsn", type=int, help="the last lsn to restore")


def run(args: argparse.Namespace) -> int:
    # Imported here: ``parser()`` builds every command's flags without boto3.
    from stream_format.layout import FormatError
    from stream_server.archive.object_store import ArchiveError
    from stream_server.archive.restore import RestoreFailed
    from stream_server.engine.dir_lock import DataDirInUse

    try:
        if args.command == "backup":
            doc = _backup(args.server, args.token_file)
        else:
            doc = _archive_command(args)
    except DataDirInUse as exc:  # a live server's directory, or another restore's
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    except (ArchiveError, FormatError, RestoreFailed, ValueError, OSError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps(doc, indent=1), flush=True)
    return 0


def _archive_command(args: argparse.Namespace) -> dict[str, Any]:
    # Imported here: boto3 is the server extra's (the CLI says so when it is missing).
    from stream_server.archive import catalog
    from stream_server.archive.object_store import ObjectStore as Store

    settings = settings_from(args)
    if not settings.archive_url:
        raise ValueError("--archive-url (or DS_ARCHIVE_URL) is required")
    store = Store.of(settings)
    if args.command == "restore":
        return _restore(args, store, settings.data_dir)
    if args.backups_command == "list":
        return catalog.listing(store)
    parse_backup_retention(args.keep)
    return catalog.prune(store, args.keep).json()


def _restore(args: argparse.Namespace, store: ObjectStore, data_dir: Path) -> dict[str, Any]:
    from stream_server.archive import catalog
    from stream_server.archive.restore import Target, restore

    if args.data_dir is None and "DS_DATA_DIR" not in os.environ:
        raise ValueError("--data-dir (or DS_DATA_DIR) is required: the new data directory")
    target = Target(
        lsn=args.target_lsn,
        time=None if args.target_time is None else catalog.parse_time(args.target_time),
    )
    return restore(store, Path(data_dir), target, args.backup)


def _backup(server: str, token_file: str | None) -> dict[str, Any]:
    import httpx

    from stream_server.archive.object_store import ArchiveError

    headers = {}
    if token_file:
        headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"
    url = server.rstrip("/") + "/_archive/backups"
    try:
        r = httpx.post(url, headers=headers, timeout=None)
    except httpx.HTTPError as exc:
        raise ArchiveError(f"POST {url}: {exc}") from None
    try:
        doc: dict[str, Any] = r.json()
    except ValueError:
        doc = {"error": r.text.strip()}
    if r.status_code != 201:
        message = doc.get("error", doc)
        raise ArchiveError(f"POST {url}: {r.status_code} {json.dumps(message)}")
    return doc
