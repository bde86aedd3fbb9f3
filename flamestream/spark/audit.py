"""Audit: does the stream's output topic hold exactly what a batch replay of its input log releases?

Compared as multisets of (global time, payload): traces carry logical times,
which depend on arrival order and so are not comparable across runs, while
global times are stamped once at the fronts and logged.

``audit_spark`` is the scalable form, a Spark job: the executors read the topic
(``format("flamestream")``) and the replay's Parquet, put each payload in a
canonical form (sorted keys), count both sides by (global time, payload) and
full-outer-join the counts; the driver gets the totals and the first
differences in global-time order, never the records.  ``audit`` does the same
over lists, for small inputs and tests.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flamestream.core.meta import GlobalTime
from flamestream.core.payload import decode_payload
from flamestream.spark.segments import list_segments, read_range
from flamestream.wire import flamestream_pb2 as pb

Record = tuple[GlobalTime, Any]
Difference = tuple[tuple[GlobalTime, str], int]
"""((global time, canonical payload JSON), surplus count)."""


def canonical(payload: Any) -> str:
    """The payload's JSON with sorted keys: equal values, equal text, whatever their key order."""
    try:
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):  # integers beyond 64 bits
        return json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def readable(key: str) -> str:
    """A canonical payload as the verdict shows it (``json.dumps`` with sorted keys)."""
    return json.dumps(json.loads(key), sort_keys=True, ensure_ascii=False)


def topic_records(data_dir: Path) -> list[Record]:
    """Every record of every partition of a cluster's output topic (``DIR/topic/<partition>``), into memory."""
    base = data_dir / "topic" if (data_dir / "topic").is_dir() else data_dir
    records: list[Record] = []
    for partition in sorted(p for p in base.iterdir() if p.is_dir() and p.name.isdigit()):
        for segment in list_segments(partition):
            for _, data in read_range(partition, segment.base, segment.base, segment.end):
                record = pb.Record.FromString(data)
                records.append((GlobalTime(record.time.ts, record.time.front), decode_payload(record.payload)))
    return records


@dataclass(frozen=True)
class Audit:
    topic: int
    replay: int
    only_in_topic: list[Difference]
    """The first (record, surplus count) pairs in global-time order (all of them from ``audit``)."""
    only_in_replay: list[Difference]
    topic_surplus: int = -1
    """Records in the topic and not in the replay, counted with multiplicity (-1: the sum of ``only_in_topic``)."""
    replay_surplus: int = -1

    @property
    def equal(self) -> bool:
        return not self.only_in_topic and not self.only_in_replay

    def verdict(self, show: int = 10) -> str:
        if self.equal:
            return f"EQUAL: the topic and the replay both hold the same {self.topic} records"
        topic_surplus = self.topic_surplus if self.topic_surplus >= 0 else sum(n for _, n in self.only_in_topic)
        replay_surplus = self.replay_surplus if self.replay_surplus >= 0 else sum(n for _, n in self.only_in_replay)
        lines = [f"DIFFERENT: topic {self.topic} records, replay {self.replay}; "
                 f"{topic_surplus} only in the topic, {replay_surplus} only in the replay"]
        for title, rows in (("only in the topic", self.only_in_topic), ("only in the replay", self.only_in_replay)):
            for (gt, payload), n in rows[:show]:
                lines.append(f"  {title}: ts={gt.ts} front={gt.front} x{n} {readable(payload)}")
        return "\n".join(lines)


def audit(topic: list[Record], replay: list[Record]) -> Audit:
    """The audit of two in-memory lists."""
    def key(record: Record) -> tuple[GlobalTime, str]:
        return record[0], canonical(record[1])

    t, r = Counter(map(key, topic)), Counter(map(key, replay))
    return Audit(len(topic), len(replay), sorted((t - r).items()), sorted((r - t).items()))


def canonical_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """(ts, front, payload JSON) Arrow batches -> (ts, front, key) with the payload's canonical JSON as key."""
    import pyarrow as pa  # type: ignore[import-untyped]

    for batch in batches:
        columns = batch.to_pydict()
        keys = [canonical(decode_payload(text.encode())) for text in columns["payload"]]
        yield pa.RecordBatch.from_arrays([batch.column("ts"), batch.column("front"), pa.array(keys, pa.string())],
                                         names=["ts", "front", "key"])


def audit_spark(spark: Any, topic: str | Path, replay: str | Path, show: int = 10) -> Audit:
    """The audit as a Spark job: counts by (global time, canonical payload), joined full outer; only the totals
    and the first ``show`` differences of each side reach the driver."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from flamestream.spark.replay import OUT_SCHEMA
    from flamestream.spark.source import FlamestreamSource

    spark.dataSource.register(FlamestreamSource)
    schema = "ts BIGINT, front INT, key STRING"

    def counted(rows: Any, name: str) -> Any:
        return (rows.select("ts", "front", "payload").mapInArrow(canonical_batches, schema)
                .groupBy("ts", "front", "key").agg(F.count(F.lit(1)).alias(name)))

    topic_rows = spark.read.format("flamestream").option("path", str(topic)).load()
    replay_rows = spark.read.schema(OUT_SCHEMA).parquet(str(replay))
    joined = (counted(topic_rows, "t").join(counted(replay_rows, "r"), ["ts", "front", "key"], "full_outer")
              .select("ts", "front", "key", F.coalesce("t", F.lit(0)).alias("t"), F.coalesce("r", F.lit(0)).alias("r"))
              .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        totals = joined.agg(F.sum("t").alias("topic"), F.sum("r").alias("replay"),
                            F.sum(F.greatest(F.col("t") - F.col("r"), F.lit(0))).alias("topic_surplus"),
                            F.sum(F.greatest(F.col("r") - F.col("t"), F.lit(0))).alias("replay_surplus")).first()

        def first(condition: str) -> list[Difference]:
            rows = joined.filter(condition).orderBy("ts", "front", "key").limit(show).collect()
            return [((GlobalTime(r["ts"], r["front"]), r["key"]), abs(r["t"] - r["r"])) for r in rows]

        return Audit(int(totals["topic"] or 0), int(totals["replay"] or 0), first("t > r"), first("r > t"),
                     int(totals["topic_surplus"] or 0), int(totals["replay_surplus"] or 0))
    finally:
        joined.unpersist()
