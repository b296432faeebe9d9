"""extract: selected fields of the messages of JSON streams, as a Parquet table.

Each ``--field NAME=JSONPATH[:TYPE]`` becomes a column: the value at
JSONPATH (Spark's ``get_json_object`` syntax, e.g. ``$.user.id`` or
``$.items[0].sku``) cast to TYPE (a Spark SQL type, default string); a
message without that path gives null. Every row also carries ``stream``,
``offset`` and ``timestamp``, so an extract can be joined back to the
stream or resumed from an offset. Binary and text streams are skipped.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

from stream_spark.jobs._session import add_common, conf_pairs, read, session

_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
KEY_COLUMNS = ("stream", "offset", "timestamp")


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    path: str
    type: str = "string"

    @classmethod
    def parse(cls, spec: str) -> Field:
        name, sep, rest = spec.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise ValueError(f"--field needs NAME=JSONPATH[:TYPE] with a plain NAME, got {spec!r}")
        if name in KEY_COLUMNS:
            raise ValueError(f"--field name {name!r} is taken by a key column")
        path, type_ = rest, "string"
        head, colon, tail = rest.rpartition(":")
        if colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9_(), ]*", tail.strip()):
            path, type_ = head, tail.strip()
        path = path.strip()
        if not path.startswith("$"):
            raise ValueError(f"JSONPATH must start with '$', got {path!r}")
        return cls(name, path, type_)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="durable-streams-extract", description=__doc__.split("\n")[0])
    add_common(p)
    p.add_argument(
        "--field",
        action="append",
        required=True,
        metavar="NAME=JSONPATH[:TYPE]",
        help="a column to extract (repeatable), e.g. user=$.user.id:bigint",
    )
    p.add_argument(
        "--partition-by",
        action="append",
        default=[],
        metavar="COLUMN",
        help="Parquet partition column (repeatable), e.g. stream",
    )
    return p


def compute(df: Any, fields: list[Field]) -> Any:
    from pyspark.sql import functions as F

    return df.where(F.col("json").isNotNull()).select(
        *KEY_COLUMNS,
        *[F.get_json_object("json", f.path).cast(f.type).alias(f.name) for f in fields],
    )


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        fields = [Field.parse(spec) for spec in args.field]
    except ValueError as exc:
        p.error(str(exc))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        p.error("--field names must be distinct")
    spark = session("durable-streams-extract", args.master, conf_pairs(args.conf))
    table = compute(read(spark, args), fields)
    writer = table.write.mode(args.mode)
    if args.partition_by:
        writer = writer.partitionBy(*args.partition_by)
    writer.parquet(args.out)
    print(f"extract: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
