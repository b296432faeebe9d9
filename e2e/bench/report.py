"""The table: one row per figure of each workload, ours against the other column, and the JSON.

The other column is the reference, or ours at ``--baseline REF``; the
targets (from the performance issue) are against the reference, so with a
baseline they are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.results import CeilingResult, IdleResult, Profile, ReplicationResult, Result

# (ours, the other column, ours' whole result) -> met?; None when it cannot be judged
Check = Callable[[float, float | None, Result], bool | None]


@dataclass(frozen=True)
class Figure:
    """One row of the table: which field of a workload's result, and its target."""

    title: str
    metric: str  # a field of the workload's result
    unit: str
    target: str = ""
    check: Check | None = None


@dataclass
class Row:
    workload: str
    title: str
    unit: str
    ours: float | None
    reference: float | None  # the other column: the reference, or the baseline
    ratio: float | None
    target: str
    met: bool | None


def at_least(k: float) -> Check:
    return lambda o, r, _: None if r is None else o >= k * r


def at_most(k: float) -> Check:
    return lambda o, r, _: None if r is None else o <= k * r


def all_woken_within(ms: float) -> Check:
    def check(o: float, r: float | None, res: Result) -> bool:
        assert isinstance(res, IdleResult)
        return res.woken == res.readers and o <= ms

    return check


FIGURES: dict[str, Callable[[Profile], list[Figure]]] = {
    "appends_64x64": lambda p: [
        Figure("64 conns, 64 streams", "appends_per_s", "appends/s", ">= 7x ref", at_least(7))
    ],
    "appends_64x1": lambda p: [
        Figure("64 conns, 1 stream", "appends_per_s", "appends/s", ">= 15x ref", at_least(15))
    ],
    "sequential": lambda p: [
        Figure("1 client sequential, p50", "p50_ms", "ms", "<= 0.5x ref", at_most(0.5))
    ],
    "catchup_bin": lambda p: [
        Figure(
            f"catch-up {p.catchup_mib} MiB, binary", "mib_per_s", "MiB/s", ">= 6x ref", at_least(6)
        )
    ],
    "catchup_json": lambda p: [
        Figure(
            f"catch-up {p.catchup_mib} MiB, JSON", "mib_per_s", "MiB/s", ">= 6x ref", at_least(6)
        )
    ],
    "live": lambda p: [
        Figure("live long-poll POST->reader, p50", "p50_ms", "ms", "<= 0.5x ref", at_most(0.5)),
        Figure("live long-poll POST->reader, p99", "p99_ms", "ms", "<= 0.5x ref", at_most(0.5)),
    ],
    "idle": lambda p: [
        Figure(
            f"{p.idle_readers:,} idle long-polls/{p.idle_streams} streams, wake p99",
            "wake_p99_ms",
            "ms",
            "all woken, <= 50 ms",
            all_woken_within(50),
        ),
        Figure(
            f"{p.idle_readers:,} idle long-polls, memory per waiter",
            "kib_per_waiter",
            "KiB",
            "reported",
        ),
    ],
    "restart": lambda p: [
        Figure(
            f"{p.restart_streams:,} streams/{p.restart_mib:,} MiB: restart to ready",
            "seconds_to_ready",
            "s",
            "<= 10 s",
            lambda o, r, _: o <= 10,
        ),
        Figure(f"{p.restart_streams:,} streams: RSS when ready", "rss_mib", "MiB", "reported"),
    ],
    "many": lambda p: many_figures(p.many_streams),
}


def many_figures(n: int) -> list[Figure]:
    """The many-streams workload's rows (many_streams.py); targets from issue 29."""
    at = f"{n:,} streams:"
    return [
        Figure(
            f"{at} creates (PUT)",
            "creates_per_s",
            "creates/s",
            ">= 0.9x appends",
            lambda o, r, res: o >= 0.9 * getattr(res, "appends_per_s", 0),
        ),
        Figure(f"{at} one append each", "appends_per_s", "appends/s", "reported"),
        Figure(f"{at} append latency in that fill, p50", "p50_ms", "ms", "reported"),
        Figure(f"{at} append latency in that fill, p99", "p99_ms", "ms", "reported"),
        Figure(
            f"{at} append latency in that fill, max",
            "max_ms",
            "ms",
            "<= 1 s",
            lambda o, r, _: o <= 1000,
        ),
        Figure(f"{at} appends over 1 s", "over_1s", "appends", "0", lambda o, r, _: o == 0),
        Figure(f"{at} checkpoints during that fill", "checkpoints", "", "reported"),
        Figure(f"{at} appends over 1 s in a checkpoint", "over_1s_in_checkpoint", "", "reported"),
        Figure(f"{at} 10 worst stalls in a checkpoint", "slowest_in_checkpoint", "", "reported"),
        Figure(f"{at} RSS per stream", "rss_bytes_per_stream", "bytes", "<= 1 KiB", _at_most(1024)),
        Figure(
            f"{at} disk per stream", "disk_bytes_per_stream", "bytes", "<= 1 KiB", _at_most(1024)
        ),
        Figure(f"{at} clean stop (SIGTERM to exit)", "stop_s", "s", "<= 5 s", _at_most(5)),
        Figure(f"{at} clean stop's exit status", "stop_status", "", "0", lambda o, r, _: o == 0),
        Figure(f"{at} restart to ready", "restart_s", "s", "<= 10 s", _at_most(10)),
        Figure(
            f"{at} RSS per stream after the restart",
            "restart_rss_bytes_per_stream",
            "bytes",
            "<= 1 KiB",
            _at_most(1024),
        ),
        Figure(f"{at} kill -9, restart to ready", "kill_restart_s", "s", "reported"),
    ]


def _at_most(limit: float) -> Check:
    return lambda o, r, _: o <= limit


# The replicated workload: the replica set against single-node ours in the same run.
REPLICATED_FIGURES: list[Figure] = [
    Figure("64 conns, 64 streams", "appends_per_s", "appends/s", ">= 0.6x single", at_least(0.6)),
    Figure("64 conns, 64 streams, CPU per append, all servers", "cpu_ms", "ms", "reported"),
    Figure("64 conns, 64 streams, CPU per append, primary", "cpu_ms_primary", "ms", "reported"),
    Figure("64 conns, 64 streams, CPU per append, a standby", "cpu_ms_standby", "ms", "reported"),
    Figure("1 client sequential, p50", "seq_p50_ms", "ms", "<= 2x single", at_most(2)),
    Figure("1 client sequential, p99", "seq_p99_ms", "ms", "reported"),
    Figure("1 client sequential, CPU per append, all servers", "seq_cpu_ms", "ms", "reported"),
    Figure("1 client sequential, CPU per append, primary", "seq_cpu_ms_primary", "ms", "reported"),
    Figure(
        "1 client sequential, CPU per append, a standby", "seq_cpu_ms_standby", "ms", "reported"
    ),
    Figure("standby lag in bytes under the appends, p50", "lag_bytes_p50", "bytes", "reported"),
    Figure("standby lag in bytes under the appends, max", "lag_bytes_max", "bytes", "reported"),
    Figure("standby lag in seconds under the appends, p50", "lag_seconds_p50", "s", "reported"),
    Figure("standby lag in seconds under the appends, max", "lag_seconds_max", "s", "reported"),
    Figure("standbys holding all after the appends", "catch_up_s", "s", "reported"),
    Figure(
        "replicas identical to the primary",
        "identical",
        "replicas",
        "all",
        lambda o, r, res: isinstance(res, ReplicationResult) and o == res.replicas,
    ),
]


ARCHIVED_FIGURES: list[Figure] = [
    Figure("64 conns, 64 streams", "appends_per_s", "appends/s", ">= 0.9x off", at_least(0.9)),
    Figure("64 conns, 64 streams, p99", "p99_ms", "ms", "reported"),
    Figure("64 conns, 64 streams, CPU per append", "cpu_ms", "ms", "reported"),
    Figure("1 client sequential", "seq_appends_per_s", "appends/s", ">= 0.9x off", at_least(0.9)),
    Figure("1 client sequential, p50", "seq_p50_ms", "ms", "reported"),
    Figure("archive lag under the 64 x 64 appends, p50", "lag_seconds_p50", "s", "reported"),
    Figure("archive lag under the 64 x 64 appends, p99", "lag_seconds_p99", "s", "reported"),
    Figure("archive holding every frame after the appends", "catch_up_s", "s", "reported"),
    Figure("the archive holds every frame", "archived_all", "", "yes", lambda o, r, res: o is True),
]


def build_archived_rows(results: dict[str, Result]) -> list[Row]:
    """The archived workload's rows: archive on ("ours") against off ("reference")."""
    return side_rows("archived", ARCHIVED_FIGURES, results.get("on"), results.get("off"))


def side_rows(
    workload: str, figures: list[Figure], ours: Result | None, other: Result | None
) -> list[Row]:
    rows = []
    for fig in figures:
        o = getattr(ours, fig.metric) if ours else None
        r = getattr(other, fig.metric) if other else None
        met = None
        if ours is not None and o is not None and fig.check is not None:
            met = fig.check(o, r, ours)
        numeric = isinstance(o, int | float) and not isinstance(o, bool)
        rows.append(
            Row(
                workload=workload,
                title=fig.title,
                unit=fig.unit,
                ours=o,
                reference=r,
                ratio=(o / r) if numeric and r and not isinstance(r, bool) else None,
                target=fig.target,
                met=met,
            )
        )
    return rows


def build_replicated_rows(results: dict[str, Result]) -> list[Row]:
    """The replicated workload's rows: the set ("ours") against single-node ("reference")."""
    return side_rows(
        "replicated", REPLICATED_FIGURES, results.get("replicated"), results.get("single")
    )


def build_rows(
    prof: Profile,
    results: dict[str, dict[str, Result]],
    ceiling: CeilingResult | None,
    *,
    targets: bool = True,
) -> list[Row]:
    """The table's rows, workload by workload (``results[workload][server]``)."""
    rows = []
    for key, figures in FIGURES.items():
        if key not in results:
            continue
        ours, ref = results[key].get("ours"), results[key].get("reference")
        for fig in figures(prof):
            o = getattr(ours, fig.metric) if ours else None
            r = getattr(ref, fig.metric) if ref else None
            met = None
            if targets and ours is not None and o is not None and fig.check is not None:
                met = fig.check(o, r, ours)
            rows.append(
                Row(
                    workload=key,
                    title=fig.title,
                    unit=fig.unit,
                    ours=o,
                    reference=r,
                    ratio=(o / r) if o is not None and r else None,
                    target=fig.target if targets else "-",
                    met=met,
                )
            )
        if key == "appends_64x64" and ceiling:
            c = ceiling.appends_per_s
            o = getattr(ours, "appends_per_s", None)
            r = getattr(ref, "appends_per_s", None)
            rows.append(
                Row(
                    workload="appends_64x64_vs_ceiling",
                    title="64 conns, 64 streams, share of ceiling",
                    unit="%",
                    ours=100 * o / c if o is not None else None,
                    reference=100 * r / c if r is not None else None,
                    ratio=None,
                    target=">= 60% of ceiling" if targets else "-",
                    met=(o >= 0.6 * c) if o is not None and targets else None,
                )
            )
    return rows


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v != v:  # NaN
        return "n/a"
    if isinstance(v, int):  # a count or an exit status
        return f"{v:,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(
    rows: list[Row],
    ceiling: CeilingResult | None,
    other: str = "reference",
    mine: str = "ours",
    ratio: str = "",
) -> str:
    """The rows as a Markdown table; ``mine`` and ``other`` name the two columns."""
    short_name = "base" if other != "reference" else "ref"
    ratio = ratio or f"{mine}/{short_name}"
    head = ("workload", "unit", mine, other, ratio, "target", "met?")
    body = []
    for r in rows:
        times = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        met = {True: "yes", False: "NO", None: "-"}[r.met]
        body.append((r.title, r.unit, fmt(r.ours), fmt(r.reference), times, r.target, met))
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    right = {2, 3, 4}

    def line(cells) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                for i, c in enumerate(cells)
            )
            + " |"
        )

    out = []
    if ceiling:
        out.append(
            f"HTTP ceiling (Starlette POST->204, uvicorn uvloop+httptools, 1 worker, "
            f"64 conns): {ceiling.appends_per_s:,.0f} req/s"
        )
    out += [
        line(head),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *(line(b) for b in body),
    ]
    return "\n".join(out)


def short(result: Result) -> str:
    """Every figure of a result on one line: ``name=value, ...`` (runs only when merged)."""
    d = result.as_dict()
    if d["runs"] == 1:
        del d["runs"]
    if d["disk_fdatasync_per_s"] is None:
        del d["disk_fdatasync_per_s"]
    return ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in d.items())


def as_json(value: Any) -> Any:
    """Dataclasses (results, rows, the profile) as plain JSON values, recursively."""
    if isinstance(value, Result):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value
