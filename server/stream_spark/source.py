"""The ``durable-streams`` PySpark data source: batch and streaming reads of a data directory.

Planning (``partitions``, ``latestOffset``) runs on the driver and reads
LMDB; ``read`` runs on the workers and reads segment files only, with the
positions planning found. Both therefore need the volume mounted. No LMDB
handle is ever kept on ``self``: Spark pickles readers after planning.

Streaming offsets are per-stream committed tails,
``{"streams": {path: {"id": stream id, "unit": tail unit}}}``: the id tells
a stream re-created at the same path from the one the checkpoint knew, so
the new one is read from its start instead of from a stale unit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from stream_spark._arrow import FIELDS, SCHEMA_DDL, slice_batches
from stream_spark._format_name import FORMAT_NAME
from stream_spark._plan import batch_ranges, cap_by_bytes, plan, select
from stream_spark._reader import Cut, MetaReader, Slice
from stream_spark.options import OptionError, ReadOptions

Offset = dict[str, Any]


@dataclass
class SlicesPartition(InputPartition):
    """The slices one task reads (one or several small streams, or part of a long one)."""

    slices: list[Slice] = field(default_factory=list)


_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "bigint": LongType(),
    "timestamp": TimestampType(),
    "binary": BinaryType(),
}
SCHEMA = StructType([StructField(name, _TYPES[kind], nullable=True) for name, kind in FIELDS])


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema``, which must be the source's own."""
    if [(f.name, f.dataType) for f in schema] != [(f.name, f.dataType) for f in SCHEMA]:
        raise OptionError(f"the durable-streams source has a fixed schema: {SCHEMA_DDL}")
    return to_arrow_schema(schema, timezone="UTC")


def _read(opts: ReadOptions, schema: StructType, partition: InputPartition) -> Iterator[Any]:
    if not isinstance(partition, SlicesPartition):
        return  # no partitions planned: Spark still runs one task, with its own placeholder
    arrow = _arrow_schema(schema)
    for sl in partition.slices:
        yield from slice_batches(
            opts.data_dir,
            sl,
            arrow,
            verify=opts.verify,
            time_from_us=opts.time_from_us,
            time_to_us=opts.time_to_us,
        )


def _partitions(
    opts: ReadOptions, cut: Cut, meta: MetaReader, ranges: Mapping[str, tuple[int, int]]
) -> list[SlicesPartition]:
    bins = plan(
        cut,
        meta,
        ranges,
        forks=opts.selection.forks,
        target_bytes=opts.partition_bytes,
        min_partitions=opts.min_partitions,
    )
    return [SlicesPartition(b) for b in bins]


class DurableStreamsDataSource(DataSource):
    """``spark.read.format("durable-streams").load("/path/to/data-dir")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return DurableStreamsReader(ReadOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DurableStreamsStreamReader(ReadOptions.parse(self.options), schema)


class DurableStreamsReader(DataSourceReader):
    """A batch read of one consistent cut, taken when the query is planned."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _arrow_schema(schema)
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[SlicesPartition]:
        o = self.opts
        with MetaReader(o.data_dir) as meta:
            cut = meta.cut()
            ranges = batch_ranges(cut, o.selection, o.start_unit, o.end_unit)
            return _partitions(o, cut, meta, ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, self.schema, partition)


class DurableStreamsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between per-stream committed tails.

    Exactly once across restarts follows from two facts: Spark journals each
    batch's (start, end) offsets before running it, and the units below a
    committed tail never change, so re-planning a journaled batch reads the
    same rows.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        _arrow_schema(schema)
        self.opts = opts
        self.schema = schema
        self._target: dict[str, tuple[int, int]] | None = None  # availableNow: path -> (id, tail)
        self._turn = 0  # where the next byte-limited trigger starts, for fairness

    # -- offsets

    def _tails(self) -> dict[str, tuple[int, int]]:
        with MetaReader(self.opts.data_dir) as meta:
            cut = meta.cut()
        return {i.path: (i.id, i.tail) for i in select(cut, self.opts.selection)}

    def initialOffset(self) -> Offset:
        if self.opts.starting == "latest":
            return _offset({p: (sid, tail) for p, (sid, tail) in self._tails().items()})
        return _offset({})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the tails this availableNow run ends at; later appends wait for the next run."""
        self._target = self._tails()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        o = self.opts
        known = start.get("streams", {})
        with MetaReader(o.data_dir) as meta:
            cut = meta.cut()
            spans: dict[str, tuple[int, int, int]] = {}  # path -> (id, from unit, to unit)
            for info in select(cut, o.selection):
                prev = known.get(info.path)
                a = prev["unit"] if prev and prev["id"] == info.id else o.selection.first_unit(info)
                b = info.tail
                if self._target is not None:
                    target = self._target.get(info.path)
                    b = min(b, target[1]) if target and target[0] == info.id else a
                spans[info.path] = (info.id, a, max(a, b))
            if isinstance(limit, ReadMaxBytes):
                ends = self._cap(cut, meta, spans, limit.max_bytes)
            else:
                ends = {p: (sid, b) for p, (sid, _, b) in spans.items()}
        return _offset(ends)

    def _cap(
        self, cut: Cut, meta: MetaReader, spans: dict[str, tuple[int, int, int]], budget: int
    ) -> dict[str, tuple[int, int]]:
        """Admit at most ``budget`` bytes, streams taken in turn from where the last trigger stopped."""
        paths = sorted(spans)
        ends = {p: (spans[p][0], spans[p][1]) for p in paths}
        if not paths:
            return ends
        start = self._turn % len(paths)
        order = paths[start:] + paths[:start]
        used = 0
        progressed = False
        for i, path in enumerate(order):
            sid, a, b = spans[path]
            if a >= b:
                continue
            if used >= budget and progressed:
                self._turn = start + i
                break
            end, size = cap_by_bytes(
                cut,
                meta,
                path,
                a,
                b,
                budget - used,
                self.opts.selection.forks,
                must_progress=not progressed,
            )
            if end > a:
                progressed = True
            ends[path] = (sid, end)
            used += size
            if end < b:  # budget spent inside this stream: the next trigger resumes here
                self._turn = start + i
                break
        else:
            self._turn = start
        return ends

    def reportLatestOffset(self) -> Offset:
        return _offset(self._tails())

    # -- data

    def partitions(self, start: Offset, end: Offset) -> list[SlicesPartition]:
        o = self.opts
        known = start.get("streams", {})
        with MetaReader(o.data_dir) as meta:
            cut = meta.cut()
            ranges: dict[str, tuple[int, int]] = {}
            for path, e in end.get("streams", {}).items():
                info = cut.streams.get(path)
                if info is None or info.id != e["id"]:
                    continue  # deleted since this batch was planned: its data is gone
                prev = known.get(path)
                a = prev["unit"] if prev and prev["id"] == e["id"] else o.selection.first_unit(info)
                if a < e["unit"]:
                    ranges[path] = (a, e["unit"])
            return _partitions(o, cut, meta, ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, self.schema, partition)

    def commit(self, end: Offset) -> None:
        """Nothing to release: the source holds no state outside the offsets."""


def _offset(ends: dict[str, tuple[int, int]]) -> Offset:
    return {"streams": {p: {"id": sid, "unit": unit} for p, (sid, unit) in sorted(ends.items())}}
