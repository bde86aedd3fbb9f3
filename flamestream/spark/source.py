"""The output topic as a PySpark Python Data Source: ``format("flamestream")``, batch and streaming.

Offsets are the topic's own: one per partition, dense and durable, so a
micro-batch [start, end) reads the same records whenever it is (re)run.  That
is what lets Spark's file sink with a checkpoint land every record exactly once
across a restart of the Spark job.  The source reads the barriers' topic logs
from the cluster's data dir (``option("path", DIR)``), which every executor of
a local or shared-filesystem deployment can see.

    spark.dataSource.register(FlamestreamSource)
    spark.readStream.format("flamestream").option("path", ".flamestream").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from flamestream.core.payload import decode_payload, encode_payload
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb

SCHEMA = "partition INT, offset BIGINT, ts BIGINT, front INT, payload STRING"
"""``payload`` is the record's JSON text; ``ts``/``front`` its global time."""


class TopicSlice(InputPartition):
    """Records [start, end) of one topic partition: one Spark task."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition, self.start, self.end = partition, start, end


def topic_dir(options: Mapping[str, str]) -> Path:
    if "path" not in options:
        raise ValueError('the flamestream source needs option("path", <cluster data dir or its topic/ dir>)')
    base = Path(options["path"])
    return base / "topic" if (base / "topic").is_dir() else base


def end_offsets(topic: Path) -> dict[str, int]:
    """Next offset of every partition (keys are strings: Spark offsets are JSON)."""
    ends: dict[str, int] = {}
    for directory in sorted(p for p in topic.iterdir() if p.is_dir() and p.name.isdigit()):
        log = SegmentedLog(directory, readonly=True)
        try:
            ends[directory.name] = log.end_offset
        finally:
            log.close()
    return ends


def read_slice(topic: Path, part: TopicSlice) -> Iterator[tuple[int, int, int, int, str]]:
    log = SegmentedLog(topic / str(part.partition), readonly=True)
    try:
        for offset, data in log.scan(part.start, part.end):
            record = pb.Record.FromString(data)
            payload = encode_payload(decode_payload(record.payload)).decode()
            yield part.partition, offset, record.time.ts, record.time.front, payload
    finally:
        log.close()


class FlamestreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "flamestream"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return TopicReader(topic_dir(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TopicStreamReader(topic_dir(self.options), self.options.get("maxRecordsPerTrigger"))


class TopicReader(DataSourceReader):
    """Batch read: every record committed to the topic when the query starts."""

    def __init__(self, topic: Path) -> None:
        self.topic = topic

    def partitions(self) -> list[InputPartition]:
        return [TopicSlice(int(p), 0, end) for p, end in end_offsets(self.topic).items() if end > 0]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, int, str]]:
        assert isinstance(partition, TopicSlice)
        yield from read_slice(self.topic, partition)


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the topic's offsets; ``maxRecordsPerTrigger`` bounds a batch."""

    def __init__(self, topic: Path, max_records: str | None) -> None:
        self.topic = topic
        self.max_records = int(max_records) if max_records else None
        self.target: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(end_offsets(self.topic), 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = end_offsets(self.topic)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self.target if self.target is not None else end_offsets(self.topic)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest = dict(start)
        for partition, end in sorted(ends.items()):
            begin = start.get(partition, 0)
            take = end - begin if budget is None else min(end - begin, budget)
            latest[partition] = begin + take
            if budget is not None:
                budget -= take
        return latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [TopicSlice(int(p), start.get(p, 0), e) for p, e in sorted(end.items()) if e > start.get(p, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, int, str]]:
        assert isinstance(partition, TopicSlice)
        yield from read_slice(self.topic, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the topic keeps its records (consumers of other groups may still need them)."""


def start_parquet_sink(spark: Any, path: str, out: str, checkpoint: str, *, available_now: bool = True,
                       max_records: int | None = None, trigger_seconds: float = 1.0) -> Any:
    """Stream the topic into Parquet; the checkpoint makes every record land once across restarts.

    ``available_now`` drains what the topic holds and stops; otherwise the query
    keeps running with a processing-time trigger.
    """
    spark.dataSource.register(FlamestreamSource)
    reader = spark.readStream.format("flamestream").option("path", path)
    if max_records:
        reader = reader.option("maxRecordsPerTrigger", str(max_records))
    writer = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
        processingTime=f"{trigger_seconds} seconds")
    return writer.start()
