"""Rows of a slice as Arrow record batches, the data source's output.

Arrow batches, not tuples: the Python-to-JVM transfer and per-row Python
conversion, not frame parsing, bound a Python data source's throughput.
Payloads are copied once, into one buffer per batch; the ``json`` column of
a JSON stream is the same buffers viewed as UTF-8 (the server stores each
message as compact JSON text), so it costs no second copy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from stream_spark._reader import KIND_JSON, Slice, read_slice

# The data source's columns as (name, Spark SQL type); the Arrow schema is derived
# from them by Spark's own conversion, so both sides always agree.
FIELDS: list[tuple[str, str]] = [
    ("stream", "string"),  # stream path as the protocol names it (below /v1/stream/)
    ("offset", "string"),  # wire offset of the row's first unit
    ("next_offset", "string"),  # wire offset just past the row
    ("unit", "bigint"),  # the row's first unit (a byte, or a message of a JSON stream)
    ("next_unit", "bigint"),
    ("timestamp", "timestamp"),  # commit time of the append
    ("content_type", "string"),
    ("payload", "binary"),  # exactly the bytes a protocol read returns for these units
    ("json", "string"),  # JSON streams: the message as text; otherwise null
    ("producer_id", "string"),
    ("producer_epoch", "bigint"),
    ("producer_seq", "bigint"),
    ("origin", "string"),  # stream whose log holds the record (a fork's source when inherited)
]
SCHEMA_DDL = ", ".join(f"{name} {kind.upper()}" for name, kind in FIELDS)

BATCH_BYTES = 8 * 1024 * 1024
BATCH_ROWS = 65536
MAX_BATCH_BYTES = 2**31 - 1  # int32 offsets of Arrow's binary type
ZERO = "0000000000000000_"


def wire_offsets(units: pa.Array) -> pa.Array:
    """``format_offset`` for a column of units, vectorised."""
    digits = pc.utf8_lpad(pc.cast(units, pa.string()), width=16, padding="0")
    return pc.binary_join_element_wise(ZERO, digits, "")


class _Builder:
    """Columns of one batch, filled row by row from a slice."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.offsets = array("i", [0])
        self.units = array("q")
        self.next_units = array("q")
        self.times = array("q")
        self.pids: list[str | None] = []
        self.epochs: list[int | None] = []
        self.seqs: list[int | None] = []
        self.producers = False

    def __len__(self) -> int:
        return len(self.units)

    def add(self, start: int, stop: int, ts: int, producer, payload: memoryview) -> None:
        self.data += payload
        if len(self.data) > MAX_BATCH_BYTES:
            raise ValueError("a single record larger than 2 GiB cannot be returned to Spark")
        self.offsets.append(len(self.data))
        self.units.append(start)
        self.next_units.append(stop)
        self.times.append(ts)
        if producer is None:
            self.pids.append(None)
            self.epochs.append(None)
            self.seqs.append(None)
        else:
            self.producers = True
            self.pids.append(producer.id)
            self.epochs.append(producer.epoch)
            self.seqs.append(producer.seq)

    def batch(self, sl: Slice, schema: pa.Schema, is_json: bool) -> pa.RecordBatch:
        n = len(self.units)
        bufs = [None, pa.py_buffer(self.offsets), pa.py_buffer(self.data)]
        payload = pa.Array.from_buffers(pa.binary(), n, bufs)
        units = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.units)])
        nexts = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.next_units)])
        times = pa.Array.from_buffers(
            schema.field("timestamp").type, n, [None, pa.py_buffer(self.times)]
        )
        if self.producers:
            pids = pa.array(self.pids, pa.string())
            epochs = pa.array(self.epochs, pa.int64())
            seqs = pa.array(self.seqs, pa.int64())
        else:
            pids, epochs, seqs = (
                pa.nulls(n, pa.string()),
                pa.nulls(n, pa.int64()),
                pa.nulls(n, pa.int64()),
            )
        json = pa.Array.from_buffers(pa.string(), n, bufs) if is_json else pa.nulls(n, pa.string())
        columns = {
            "stream": pa.repeat(sl.stream, n),
            "offset": wire_offsets(units),
            "next_offset": wire_offsets(nexts),
            "unit": units,
            "next_unit": nexts,
            "timestamp": times,
            "content_type": pa.repeat(sl.content_type, n),
            "payload": payload,
            "json": json,
            "producer_id": pids,
            "producer_epoch": epochs,
            "producer_seq": seqs,
            "origin": pa.repeat(sl.origin, n),
        }
        arrays = [columns[f.name].cast(f.type) for f in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def slice_batches(
    data_dir: str | Path,
    sl: Slice,
    schema: pa.Schema,
    *,
    verify: bool = True,
    time_from_us: int | None = None,
    time_to_us: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of at most about 8 MiB of payload or 64 Ki rows."""
    is_json = sl.kind == KIND_JSON
    b = _Builder()
    for row in read_slice(
        data_dir, sl, verify=verify, time_from_us=time_from_us, time_to_us=time_to_us
    ):
        b.add(row.start, row.stop, row.timestamp_us, row.producer, row.payload)
        if len(b.data) >= BATCH_BYTES or len(b) >= BATCH_ROWS:
            yield b.batch(sl, schema, is_json)
            b = _Builder()
    if len(b):
        yield b.batch(sl, schema, is_json)
