"""The data source's options, parsed once on the driver into a typed value.

Spark hands options over as a case-insensitive map of strings; parsing them
up front turns a typo'd value into an error at ``load()`` instead of a
failed task, and gives the pickled reader plain fields.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from stream_format.offsets import START, OffsetError, parse_offset
from stream_spark._plan import FORKS_OWN, FORKS_STITCH, Selection

DEFAULT_PARTITION_BYTES = 128 * 1024 * 1024
_SIZE = re.compile(r"\A\s*(\d+)\s*([kmgt]i?b?|b)?\s*\Z", re.IGNORECASE)
_FACTORS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

# Every option the source reads, lower-cased as Spark passes them.
KNOWN = {
    "path",
    "streams",
    "startoffset",
    "endoffset",
    "starttime",
    "endtime",
    "partitionsizebytes",
    "minpartitions",
    "includedeleted",
    "includeexpired",
    "forks",
    "verifychecksums",
    "maxbytespertrigger",
    "startingoffsets",
}


class OptionError(ValueError):
    """An option value the source cannot use."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    data_dir: str
    selection: Selection
    start_unit: int | None = None
    end_unit: int | None = None
    time_from_us: int | None = None
    time_to_us: int | None = None
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    min_partitions: int = 1
    verify: bool = True
    max_bytes_per_trigger: int | None = None
    starting: str = "earliest"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - KNOWN)
        if unknown:
            raise OptionError(f"unknown option(s) for durable-streams: {', '.join(unknown)}")
        path = opts.get("path")
        if not path:
            raise OptionError('a data directory is required: .load("/path/to/data-dir")')
        forks = opts.get("forks", FORKS_STITCH).lower()
        if forks not in (FORKS_STITCH, FORKS_OWN):
            raise OptionError(f"forks must be {FORKS_STITCH!r} or {FORKS_OWN!r}, not {forks!r}")
        starting = opts.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise OptionError("startingOffsets must be 'earliest' or 'latest'")
        max_trigger = opts.get("maxbytespertrigger")
        return cls(
            data_dir=path,
            selection=Selection(
                glob=opts.get("streams", "*"),
                include_deleted=_bool(opts, "includedeleted", False),
                include_expired=_bool(opts, "includeexpired", False),
                forks=forks,
            ),
            start_unit=_offset(opts.get("startoffset"), "startOffset"),
            end_unit=_offset(opts.get("endoffset"), "endOffset"),
            time_from_us=_time(opts.get("starttime"), "startTime"),
            time_to_us=_time(opts.get("endtime"), "endTime"),
            partition_bytes=_size(
                opts.get("partitionsizebytes"), "partitionSizeBytes", DEFAULT_PARTITION_BYTES
            ),
            min_partitions=_positive(opts.get("minpartitions"), "minPartitions", 1),
            verify=_bool(opts, "verifychecksums", True),
            max_bytes_per_trigger=(
                _size(max_trigger, "maxBytesPerTrigger", 0) if max_trigger else None
            ),
            starting=starting,
        )


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"{key} must be true or false, not {raw!r}")
    return value == "true"


def _offset(raw: str | None, name: str) -> int | None:
    """A wire offset (or -1) as a unit; None means no bound."""
    if raw is None:
        return None
    try:
        unit = parse_offset(raw.strip(), allow_now=False)
    except OffsetError as exc:
        raise OptionError(f"{name}: {exc}") from None
    return None if unit == START else unit


def _time(raw: str | None, name: str) -> int | None:
    """ISO 8601 (UTC when no zone is given) or Unix seconds, as microseconds."""
    if raw is None:
        return None
    text = raw.strip()
    try:
        return round(float(text) * 1_000_000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise OptionError(f"{name}: not an ISO 8601 time or Unix seconds: {raw!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return round(dt.timestamp() * 1_000_000)


def _size(raw: str | None, name: str, default: int) -> int:
    if raw is None:
        return default
    m = _SIZE.match(raw)
    if m is None:
        raise OptionError(f"{name}: not a size in bytes (e.g. 134217728 or 128m): {raw!r}")
    value = int(m.group(1)) * _FACTORS[(m.group(2) or "")[:1].lower()]
    if value <= 0:
        raise OptionError(f"{name} must be positive")
    return value


def _positive(raw: str | None, name: str, default: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise OptionError(f"{name} must be a positive integer")
    return value
