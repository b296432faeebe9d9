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

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from stream_spark._reader import KIND_JSON, Producer, Slice, read_slice

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


def _batch(
    sl: Slice,
    schema: pa.Schema,
    is_json: bool,
    data: bytearray,
    offsets: array[int],
    starts: array[int],
    stops: array[int],
    times: array[int],
    producers: list[tuple[int, Producer]],
) -> pa.RecordBatch:
    n = len(starts)
    if len(data) > MAX_BATCH_BYTES:
        raise ValueError(f"stream {sl.stream!r}: a record over 2 GiB cannot be returned to Spark")
    bufs = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    payload = pa.Array.from_buffers(pa.binary(), n, bufs)
    units = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(starts)])
    nexts = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(stops)])
    stamps = pa.Array.from_buffers(schema.field("timestamp").type, n, [None, pa.py_buffer(times)])
    if producers:
        pids: list[str | None] = [None] * n
        epochs: list[int | None] = [None] * n
        seqs: list[int | None] = [None] * n
        for i, p in producers:
            pids[i], epochs[i], seqs[i] = p.id, p.epoch, p.seq
        pid_col = pa.array(pids, pa.string())
        epoch_col, seq_col = pa.array(epochs, pa.int64()), pa.array(seqs, pa.int64())
    else:
        pid_col = pa.nulls(n, pa.string())
        epoch_col, seq_col = pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64())
    columns = {
        "stream": pa.repeat(sl.stream, n),
        "offset": wire_offsets(units),
        "next_offset": wire_offsets(nexts),
        "unit": units,
        "next_unit": nexts,
        "timestamp": stamps,
        "content_type": pa.repeat(sl.content_type, n),
        "payload": payload,
        "json": pa.Array.from_buffers(pa.string(), n, bufs)
        if is_json
        else pa.nulls(n, pa.string()),
        "producer_id": pid_col,
        "producer_epoch": epoch_col,
        "producer_seq": seq_col,
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
    """Record batches of at most about 8 MiB of payload or 64 Ki rows.

    The per-row loop is the hot path of every read of small records (JSON
    messages): columns are plain arrays and locals, one append each.
    """
    is_json = sl.kind == KIND_JSON
    rows = read_slice(data_dir, sl, verify=verify, time_from_us=time_from_us, time_to_us=time_to_us)
    done = False
    while not done:
        data = bytearray()
        offsets = array("i", [0])
        starts, stops, times = array("q"), array("q"), array("q")
        producers: list[tuple[int, Producer]] = []
        n = 0
        done = True
        for row in rows:
            data += row.payload
            offsets.append(len(data))
            starts.append(row.start)
            stops.append(row.stop)
            times.append(row.timestamp_us)
            if row.producer is not None:
                producers.append((n, row.producer))
            n += 1
            if n >= BATCH_ROWS or len(data) >= BATCH_BYTES:
                done = False
                break
        if n:
            yield _batch(sl, schema, is_json, data, offsets, starts, stops, times, producers)
