"""``durable-streams-operator``: run the kopf operator (all namespaces by default)."""

from __future__ import annotations

import argparse
import sys

import kopf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="durable-streams-operator", description=__doc__)
    ap.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all)",
    )
    ap.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint for the operator pod",
    )
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    import stream_operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or None,
        liveness_endpoint=args.liveness,
        standalone=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
