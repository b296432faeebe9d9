"""The archive's commands: ``backup``, ``backups list``, ``backups prune`` and ``restore``
(docs/backup.md). Each prints one JSON document on stdout; a failure prints
``{"error": ...}`` and exits 1, a wrong argument (naming its flag) exits 2 as argparse's
own refusals do. ``backup`` and ``restore`` show their progress on stderr
(``progress.Meter``): stdout stays one JSON document.

The object store is given as the server's settings give it (``--archive-url``,
``--archive-endpoint``, ``--archive-region``, ``--archive-ca-bundle``, or their
``DS_ARCHIVE_*`` variables); credentials as the AWS SDKs read them.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_server.config import add_arguments, settings_from
from stream_server.declared.checks import parse_backup_retention

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
    prune.add_argument(
        "--unfinished-after",
        default="24h",
        help="delete unfinished backups (parts, no manifest) begun longer ago than this "
        "(a duration: 24h, 30m, 0s; default 24h)",
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
    from stream_server.archive.backup.restore import RestoreFailed
    from stream_server.archive.backup.restore_args import BadArgument
    from stream_server.archive.object_store import ArchiveError
    from stream_server.engine.dir_lock import DataDirInUse

    try:
        if args.command == "backup":
            doc = _backup(args.server, args.token_file)
        else:
            doc = _archive_command(args)
    except (DataDirInUse, BadArgument) as exc:  # in use; or an argument wrong in itself
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    except (ArchiveError, FormatError, RestoreFailed, ValueError, OSError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps(doc, indent=1), flush=True)
    return 0


def _archive_command(args: argparse.Namespace) -> dict[str, Any]:
    # Imported here: boto3 is the server extra's (the CLI says so when it is missing).
    from stream_server.archive.backup import catalog
    from stream_server.archive.backup.restore_args import BadArgument
    from stream_server.archive.object_store import ObjectStore as Store

    try:
        settings = settings_from(args)
    except ValueError as exc:  # a setting wrong in itself (it names its flag)
        raise BadArgument(str(exc)) from None
    if not settings.archive_url:
        raise ValueError("--archive-url (or DS_ARCHIVE_URL) is required")
    store = Store(settings)
    if args.command == "restore":
        return _restore(args, store, settings.data_dir)
    if args.backups_command == "list":
        return catalog.listing(store)
    parse_backup_retention(args.keep)
    grace = _duration("--unfinished-after", args.unfinished_after)
    return catalog.prune(store, args.keep, unfinished_grace=grace).json()


def _duration(flag: str, text: str) -> float:
    """Seconds of ``30m``, ``24h``, ``7d`` (``--backup-retention``'s durations) or ``0s``."""
    from stream_server.archive.backup.restore_args import BadArgument

    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        seconds, last = parse_backup_retention(text)
    except ValueError as exc:
        raise BadArgument(f"{flag} {text!r}: {exc}") from None
    if seconds is None or last is not None:
        raise BadArgument(f"{flag} {text!r}: a duration (30m, 24h, 7d) is needed")
    return seconds


def _restore(args: argparse.Namespace, store: ObjectStore, data_dir: Path) -> dict[str, Any]:
    from stream_server.archive import progress
    from stream_server.archive.backup import restore_args
    from stream_server.archive.backup.restore import restore

    if args.data_dir is None and "DS_DATA_DIR" not in os.environ:
        raise restore_args.BadArgument(
            "--data-dir (or DS_DATA_DIR) is required: the new data directory"
        )
    # The arguments first, then what the archive holds, then the work: a refusal
    # costs no download and names the flag at fault.
    target = restore_args.target(args.target_lsn, args.target_time)
    restore_args.data_dir(Path(data_dir))
    backup_id = restore_args.plan(store, args.backup, target)
    meter = progress.Meter("restore")
    with progress.reporting(meter):
        done = restore(store, Path(data_dir), target, backup_id)
    meter.finish()
    return done


def _backup(server: str, token_file: str | None) -> dict[str, Any]:
    """``POST /_archive/backups``, waited for; meanwhile the backup's parts as the
    server's catalog lists them (the unfinished backup begun now), on stderr."""
    import httpx

    from stream_server.archive import progress
    from stream_server.archive.object_store import ArchiveError

    headers = {}
    if token_file:
        headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"
    url = server.rstrip("/") + "/_archive/backups"
    answer: list[httpx.Response | httpx.HTTPError] = []

    def post() -> None:
        try:
            answer.append(httpx.post(url, headers=headers, timeout=None))
        except httpx.HTTPError as exc:
            answer.append(exc)

    began = time.time()
    meter = progress.Meter("backup")
    worker = threading.Thread(target=post, name="backup-post", daemon=True)
    worker.start()
    worker.join(meter.every)
    while worker.is_alive():
        _poll_parts(meter, url, headers, began)
        worker.join(meter.every)
    r = answer[0]
    if isinstance(r, httpx.HTTPError):
        raise ArchiveError(f"POST {url}: {r}") from None
    try:
        doc: dict[str, Any] = r.json()
    except ValueError:
        doc = {"error": r.text.strip()}
    if r.status_code != 201:
        message = doc.get("error", doc)
        raise ArchiveError(f"POST {url}: {r.status_code} {json.dumps(message)}")
    meter.set(int(doc.get("bytes") or 0), meter.objects)
    meter.finish()
    return doc


def _poll_parts(meter: Any, url: str, headers: dict[str, str], began: float) -> None:
    """The parts uploaded so far: the unfinished backup whose id (its start, to the
    second) is not older than this command. A failed look is no error: it is progress
    only."""
    import httpx

    from stream_format.archive import backup_id_time

    try:
        doc = httpx.get(url, headers=headers, timeout=10).json()
        for item in doc.get("unfinished", ()):
            if backup_id_time(str(item["id"])) >= int(began) - 1:
                meter.set(int(item["bytes"]), int(item["parts"]))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return
