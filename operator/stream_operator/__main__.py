"""``durable-streams-operator``: run the kopf operator (all namespaces by default).

With leader election (the default), the process first waits for the Lease;
only the holder runs kopf, and a holder that loses it exits with status 1 so
that its pod restarts as a standby. ``/metrics`` and ``/healthz`` are served
from the start, by standbys too.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import sys
import threading

import kopf

from stream_operator.configuration import operator_settings
from stream_operator.controllers import operator_metrics
from stream_operator.kube import api_client, leadership


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    settings = operator_settings.current()
    ap = argparse.ArgumentParser(prog="durable-streams-operator", description=__doc__)
    ap.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all)",
    )
    ap.add_argument(
        "--liveness",
        default=None,
        help="also serve kopf's own liveness endpoint at this URL (e.g. http://0.0.0.0:8080/healthz)",
    )
    ap.add_argument(
        "--metrics-address",
        default=env("DS_OPERATOR_METRICS_ADDRESS", "0.0.0.0"),
        help="address of /metrics and /healthz (env DS_OPERATOR_METRICS_ADDRESS)",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=settings.metrics_port,
        help="port of /metrics and /healthz; 0 turns them off (env DS_OPERATOR_METRICS_PORT)",
    )
    ap.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=settings.leader_election,
        help="hold a Lease before acting (default: on; env DS_OPERATOR_LEADER_ELECTION)",
    )
    ap.add_argument(
        "--lease-name",
        default=env("DS_OPERATOR_LEASE_NAME", "durable-streams-operator"),
        help="the Lease's name (env DS_OPERATOR_LEASE_NAME)",
    )
    ap.add_argument(
        "--lease-namespace",
        default=env("POD_NAMESPACE", "default"),
        help="the Lease's namespace (env POD_NAMESPACE: the operator's own)",
    )
    defaults = leadership.Timings()
    ap.add_argument("--lease-duration", type=_positive, default=defaults.lease_duration)
    ap.add_argument("--renew-deadline", type=_positive, default=defaults.renew_deadline)
    ap.add_argument("--retry-period", type=_positive, default=defaults.retry_period)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.timings = leadership.Timings(args.lease_duration, args.renew_deadline, args.retry_period)
    try:
        args.timings.check()
    except ValueError as exc:
        ap.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        operator_settings.load()
    except operator_settings.SettingError as exc:
        # One line naming the variable, before anything starts (no traceback).
        print(f"durable-streams-operator: {exc}", file=sys.stderr)
        return 2
    args = parse(argv)
    from stream_operator.controllers import handlers

    kopf.configure(verbose=args.verbose)
    # The election's client logs every retry at INFO; this module says what matters.
    logging.getLogger("leaderelection").setLevel(logging.WARNING)
    elected = _leadership(args) if args.leader_election else None
    leadership.install(elected)
    running = threading.Event()

    def healthy() -> bool:
        """A standby is alive while it campaigns; a leader while kopf's loop runs and its
        periodic workers are neither stuck nor gone."""
        if not running.is_set():
            return elected is not None and not elected.lost.is_set()
        return handlers.alive()

    if args.metrics_port:
        operator_metrics.serve(args.metrics_address, args.metrics_port, healthy)

    def operate(stop: concurrent.futures.Future[None]) -> None:
        running.set()
        operator_metrics.LEADER.set(1)
        try:
            asyncio.run(_kopf_until(args, stop))
        except asyncio.CancelledError:
            pass  # as kopf.run
        finally:
            operator_metrics.LEADER.set(0)

    if elected is None:
        operate(concurrent.futures.Future())
        return 0
    return 1 if elected.run(operate) else 0


def _leadership(args: argparse.Namespace) -> leadership.Leadership:
    """The election for the operator's Lease, on a client of its own: it writes the Lease
    to become the leader, which the handlers' client (writes refused while this process
    may not act) would refuse."""
    campaigner = api_client.new_api_client(api_client.api().configuration, leader_only=False)
    campaigner.user_agent = api_client.api().user_agent
    return leadership.Leadership(
        campaigner, args.lease_name, args.lease_namespace, leadership.identity(), args.timings
    )


async def _kopf_until(args: argparse.Namespace, stop: concurrent.futures.Future[None]) -> None:
    """kopf until ``stop`` is done. kopf waits for a thread-side flag in an executor
    thread that nothing releases after SIGTERM (the process would not exit): it is given
    a flag of its own loop."""
    loop = asyncio.get_running_loop()
    flag: asyncio.Future[None] = loop.create_future()

    def set_flag() -> None:
        if not flag.done():
            flag.set_result(None)

    def raise_flag(_: object) -> None:
        loop.call_soon_threadsafe(set_flag)

    stop.add_done_callback(raise_flag)
    await kopf.operator(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        standalone=True,
        stop_flag=flag,
    )


if __name__ == "__main__":
    sys.exit(main())
