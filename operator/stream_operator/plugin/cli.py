"""``kubectl-dstream``: the arguments, and the exit status (0 done, 1 refused or failed).

kubectl passes every argument after ``kubectl dstream`` to the plugin unparsed, so the
connection flags (``-n``, ``--context``, ``--kubeconfig``) are accepted before the
subcommand and after it, as kubectl accepts them anywhere.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import urllib3

from stream_operator.plugin import (
    PluginError,
    backup,
    bundle,
    commands,
    logs,
    replica,
    restart,
)
from stream_operator.plugin.connect import connect


def _connection_flags(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "-n", "--namespace", default=default, help="the namespace (default: the context's)"
    )
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument(
        "--kubeconfig", default=default, help="the kubeconfig file (default: $KUBECONFIG)"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl dstream",
        description=(
            "Look after DurableStreams: status, switchover, restarts, logs, support bundles, "
            "hibernation, fencing, backups, promotion and demotion of replica clusters."
        ),
    )
    _connection_flags(top, None)
    # In the subcommands the flags keep what was given before the subcommand, if anything.
    shared = argparse.ArgumentParser(add_help=False)
    _connection_flags(shared, argparse.SUPPRESS)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser(
        "status", parents=[shared], help="phase, Lease, each replica's role, lag and term"
    )
    status.add_argument("name", help="the DurableStream")
    status.add_argument("-o", "--output", choices=["text", "json"], default="text")
    status.add_argument(
        "--live",
        action="store_true",
        help="also ask each pod for GET /replication (through the API server's pod proxy)",
    )

    switch = sub.add_parser(
        "switchover", parents=[shared], help="make an in-sync standby the primary"
    )
    switch.add_argument("name", help="the DurableStream")
    switch.add_argument("target", help="the pod to become primary, e.g. events-2")
    switch.add_argument(
        "--no-wait", dest="wait", action="store_false", help="annotate and return at once"
    )
    switch.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the outcome (60)"
    )

    _restart_logs_report(sub, shared)
    hib = sub.add_parser(
        "hibernate", parents=[shared], help="scale to zero keeping the data (on), or wake (off)"
    )
    hib.add_argument("name", help="the DurableStream")
    hib.add_argument("state", choices=["on", "off"])

    for verb, what in (("fence", "fence pods (up, not ready)"), ("unfence", "unfence pods")):
        cmd = sub.add_parser(verb, parents=[shared], help=what)
        cmd.add_argument("name", help="the DurableStream")
        cmd.add_argument("pods", nargs="*", metavar="POD", help="pod names, e.g. events-1")
        cmd.add_argument("--all", dest="all_pods", action="store_true", help="every pod")
    bak = sub.add_parser(
        "backup", parents=[shared], help="take a base backup now (a DurableStreamBackup)"
    )
    bak.add_argument("name", help="the DurableStream")
    bak.add_argument("--target", choices=["prefer-standby", "primary"], default=None)
    bak.add_argument(
        "--no-wait", dest="wait", action="store_false", help="create it and return at once"
    )
    bak.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait for the outcome (3600)"
    )
    promote = sub.add_parser(
        "promote", parents=[shared], help="promote a replica cluster (replica.enabled: false)"
    )
    promote.add_argument("name", help="the replica cluster's DurableStream")
    demote = sub.add_parser(
        "demote", parents=[shared], help="make a writing set follow another set's archive"
    )
    demote.add_argument("name", help="the DurableStream to demote")
    demote.add_argument(
        "--to", required=True, help="the DurableStream (same namespace) whose archive to follow"
    )
    demote.add_argument(
        "--rebuild",
        action="store_true",
        help="demotionPolicy Rebuild: delete its volumes and restore from that archive "
        "(default Refuse: stop and keep them)",
    )
    return top


def _restart_logs_report(sub: Any, shared: argparse.ArgumentParser) -> None:
    again = sub.add_parser(
        "restart",
        parents=[shared],
        help="restart every pod, the primary last after a switchover (or --pod one pod now)",
    )
    again.add_argument("name", help="the DurableStream")
    again.add_argument("--pod", help="only this pod (N or NAME-N): its pod is deleted")
    again.add_argument(
        "--force", action="store_true", help="with --pod: delete the primary's pod too"
    )
    log = sub.add_parser("logs", parents=[shared], help="the servers' logs, prefixed by pod")
    log.add_argument("name", help="the DurableStream")
    log.add_argument("--pod", help="only this pod (N or NAME-N)")
    log.add_argument("-f", "--follow", action="store_true", help="stream the logs")
    log.add_argument("--since", help="only lines newer than this (30s, 5m, 1h)")
    log.add_argument(
        "-p", "--previous", action="store_true", help="the run before the last restart"
    )
    rep = sub.add_parser(
        "report", parents=[shared], help="a support bundle (zip): objects, events, logs, views"
    )
    rep.add_argument("name", help="the DurableStream")
    rep.add_argument(
        "-o", "--output", help="FILE.zip, or a directory for it (default: NAME-report-TIME.zip)"
    )


def _restart_logs_report_run(
    api: Any, namespace: str, args: argparse.Namespace, out: Any
) -> int | None:
    """restart, logs and report (None: another command)."""
    if args.command == "restart":
        return restart.restart(api, namespace, args.name, pod=args.pod, force=args.force, out=out)
    if args.command == "logs":
        return logs.logs(
            api,
            namespace,
            args.name,
            pod=args.pod,
            follow=args.follow,
            since=args.since,
            previous=args.previous,
            out=out,
            err=sys.stderr,
        )
    if args.command == "report":
        return bundle.report(api, namespace, args.name, output=args.output, out=out)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = sys.stdout
    try:
        api, namespace = connect(args.kubeconfig, args.context, args.namespace)
        with api:
            if args.command == "status":
                return commands.status(
                    api,
                    namespace,
                    args.name,
                    live=args.live,
                    as_json=args.output == "json",
                    out=out,
                )
            if args.command == "switchover":
                return commands.switchover(
                    api,
                    namespace,
                    args.name,
                    args.target,
                    wait=args.wait,
                    timeout=args.timeout,
                    out=out,
                )
            if args.command == "backup":
                return backup.backup(
                    api,
                    namespace,
                    args.name,
                    target=args.target,
                    wait=args.wait,
                    timeout=args.timeout,
                    out=out,
                )
            if args.command == "promote":
                return replica.promote(api, namespace, args.name, out)
            if args.command == "demote":
                return replica.demote(
                    api, namespace, args.name, args.to, rebuild=args.rebuild, out=out
                )
            done = _restart_logs_report_run(api, namespace, args, out)
            if done is not None:
                return done
            if args.command == "hibernate":
                return commands.hibernate(api, namespace, args.name, args.state == "on", out)
            return commands.fence(
                api,
                namespace,
                args.name,
                args.pods,
                all_pods=args.all_pods,
                on=args.command == "fence",
                out=out,
            )
    except urllib3.exceptions.HTTPError as exc:
        why: object = f"cannot reach the API server: {exc}"
    except PluginError as exc:
        why = exc
    out.flush()
    print(f"error: {why}", file=sys.stderr)
    return 1
