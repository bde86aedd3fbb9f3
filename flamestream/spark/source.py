"""The cluster's logs as PySpark Python Data Sources, batch and streaming.

``format("flamestream")`` reads the output topic; ``format("flamestream-input")``
reads the fronts' durable input log, which is what batch replay runs on.  Both
cut their logs into slices of one segment at most (``spark/segments.py``), one
Spark task each, so executors read the files and nothing passes through the
driver.  They read under the cluster's data dir (``option("path", DIR)``),
which every executor of a local or shared-filesystem deployment can see.

Topic offsets are the topic's own: one per partition, dense and durable, so a
micro-batch [start, end) reads the same records whenever it is (re)run.  That
is what lets Spark's file sink with a checkpoint land every record exactly once
across a restart of the Spark job.

    spark.dataSource.register(FlamestreamSource)
    spark.readStream.format("flamestream").option("path", ".flamestream").load()
    spark.dataSource.register(InputLogSource)
    spark.read.format("flamestream-input").option("path", ".flamestream").option("from", "1700000000000:0").load()
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from flamestream.core.meta import GlobalTime
from flamestream.core.payload import decode_payload, encode_payload
from flamestream.spark.segments import Segment, end_offset, list_segments, read_one, read_range, slices
from flamestream.storage.input_log import check_covers, decode_record
from flamestream.wire import flamestream_pb2 as pb

SCHEMA = "partition INT, offset BIGINT, ts BIGINT, front INT, payload STRING"
"""The topic: ``payload`` is the record's JSON text; ``ts``/``front`` its global time."""

INPUT_SCHEMA = "front INT, offset BIGINT, ts BIGINT, seq BIGINT, payload STRING"
"""The input log: global time (``ts``, ``front``), the front's sequence number in that millisecond (the item's
initial trace is ``(seq,)``) and the event's payload as JSON text."""

DEFAULT_SLICE = 100_000
"""Records per Spark task at most (a slice never crosses a segment either)."""


class LogSlice(InputPartition):
    """Records [start, end) of one segment of one log (a topic partition or a front's input log): one task."""

    def __init__(self, directory: str, key: int, base: int, start: int, end: int) -> None:
        super().__init__((key, start, end))
        self.directory, self.key, self.base, self.start, self.end = directory, key, base, start, end


def log_slices(directory: Path, key: int, start: int, stop: int, max_records: int,
               segments: list[Segment] | None = None) -> list[LogSlice]:
    segments = list_segments(directory) if segments is None else segments
    out: list[LogSlice] = []
    for a, b in slices(segments, start, stop, max_records):
        base = next(s.base for s in segments if s.base <= a < s.end)
        out.append(LogSlice(str(directory), key, base, a, b))
    return out


def read_log_slice(part: LogSlice) -> Iterator[tuple[int, bytes]]:
    """The one reader both sources use: (offset, record bytes) of a slice, read by the task that owns it."""
    return read_range(Path(part.directory), part.base, part.start, part.end)


# -- the output topic --------------------------------------------------------------------------------------------

def topic_dir(options: Mapping[str, str]) -> Path:
    if "path" not in options:
        raise ValueError('the flamestream source needs option("path", <cluster data dir or its topic/ dir>)')
    base = Path(options["path"])
    return base / "topic" if (base / "topic").is_dir() else base


def _partitions(topic: Path) -> list[Path]:
    return sorted((p for p in topic.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def end_offsets(topic: Path) -> dict[str, int]:
    """Next offset of every partition (keys are strings: Spark offsets are JSON)."""
    return {directory.name: end_offset(directory) for directory in _partitions(topic)}


def read_slice(part: LogSlice) -> Iterator[tuple[int, int, int, int, str]]:
    for offset, data in read_log_slice(part):
        record = pb.Record.FromString(data)
        payload = encode_payload(decode_payload(record.payload)).decode()
        yield part.key, offset, record.time.ts, record.time.front, payload


def _topic_slices(topic: Path, start: Mapping[str, int], end: Mapping[str, int],
                  max_records: int) -> list[InputPartition]:
    out: list[InputPartition] = []
    for partition, stop in sorted(end.items(), key=lambda kv: int(kv[0])):
        if stop > start.get(partition, 0):
            out.extend(log_slices(topic / partition, int(partition), start.get(partition, 0), stop, max_records))
    return out


def _slice_size(options: Mapping[str, str]) -> int:
    return int(options.get("maxRecordsPerPartition", DEFAULT_SLICE))


class FlamestreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "flamestream"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return TopicReader(topic_dir(self.options), _slice_size(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TopicStreamReader(topic_dir(self.options), self.options.get("maxRecordsPerTrigger"),
                                 _slice_size(self.options))


class TopicReader(DataSourceReader):
    """Batch read: every record committed to the topic when the query starts."""

    def __init__(self, topic: Path, slice_size: int) -> None:
        self.topic, self.slice_size = topic, slice_size

    def partitions(self) -> list[InputPartition]:
        return _topic_slices(self.topic, {}, end_offsets(self.topic), self.slice_size)

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, int, str]]:
        assert isinstance(partition, LogSlice)
        yield from read_slice(partition)


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the topic's offsets; ``maxRecordsPerTrigger`` bounds a batch."""

    def __init__(self, topic: Path, max_records: str | None, slice_size: int) -> None:
        self.topic = topic
        self.max_records = int(max_records) if max_records else None
        self.slice_size = slice_size
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
        return _topic_slices(self.topic, start, end, self.slice_size)

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, int, str]]:
        assert isinstance(partition, LogSlice)
        yield from read_slice(partition)

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


# -- the fronts' input log ---------------------------------------------------------------------------------------

def input_dir(path: str | Path) -> Path:
    """``DIR/input`` of a cluster data dir, or the path itself when it holds ``front-<id>`` directories."""
    base = Path(path)
    return base / "input" if (base / "input").is_dir() else base


def front_logs(path: str | Path) -> dict[int, Path]:
    """Front id -> its input log directory."""
    base = input_dir(path)
    logs: dict[int, Path] = {}
    for directory in base.glob("front-*"):
        suffix = directory.name.removeprefix("front-")
        if directory.is_dir() and suffix.isdigit():
            logs[int(suffix)] = directory
    return dict(sorted(logs.items()))


def parse_time(text: str) -> GlobalTime:
    """``TS:FRONT`` (or ``TS-FRONT``, as snapshot directories are named) -> GlobalTime."""
    for sep in (":", "-"):
        ts, found, front = text.rpartition(sep)
        if found and ts:
            try:
                return GlobalTime(int(ts), int(front))
            except ValueError:
                pass
    raise ValueError(f"not a global time: {text!r} (expected TS:FRONT)")


def _record_time(directory: Path, segments: list[Segment], offset: int) -> GlobalTime:
    record = decode_record(read_one(directory, segments, offset))
    return GlobalTime(int(record["ts"]), int(record["front"]))


def input_slices(path: str | Path, *, start: GlobalTime | None = None, stop: GlobalTime | None = None,
                 min_partitions: int = 1, max_records: int = DEFAULT_SLICE) -> list[LogSlice]:
    """Slices of every front's input log that may hold events in [start, stop).

    A front stamps and appends under one lock, so its log is in global-time
    order: a segment whose successor starts below ``start``, or that itself
    starts at or after ``stop``, holds nothing of the interval and is not read
    at all (that is what lets a replay from a snapshot skip — or outlive — the
    log before it).  Reading one record per segment is all the driver does.
    """
    chosen: list[tuple[Path, int, list[Segment], list[Segment]]] = []
    total = 0
    for front, directory in front_logs(path).items():
        check_covers(directory, start)  # a log retention cut after ``start`` would silently miss events
        segments = [s for s in list_segments(directory) if s.count]
        firsts = [_record_time(directory, segments, s.base) for s in segments] if start or stop else []
        keep = [s for i, s in enumerate(segments)
                if not (start is not None and i + 1 < len(segments) and firsts[i + 1] < start)
                and not (stop is not None and firsts[i] >= stop)]
        chosen.append((directory, front, segments, keep))
        total += sum(s.count for s in keep)
    size = max(1, min(max_records, math.ceil(total / max(1, min_partitions))))
    out: list[LogSlice] = []
    for directory, front, segments, keep in chosen:
        for segment in keep:
            out.extend(log_slices(directory, front, segment.base, segment.end, size, segments))
    return out or [LogSlice("", -1, 0, 0, 0)]  # Spark wants a partition even when there is nothing to read


def read_input_slice(part: LogSlice, start: GlobalTime | None = None,
                     stop: GlobalTime | None = None) -> Iterator[tuple[int, int, int, int, str]]:
    for offset, data in read_log_slice(part):
        record = decode_record(data)
        gt = GlobalTime(record["ts"], record["front"])
        if (start is not None and gt < start) or (stop is not None and gt >= stop):
            continue
        yield record["front"], offset, gt.ts, record["seq"], json.dumps(
            record["payload"], ensure_ascii=False, separators=(",", ":"))


class InputLogSource(DataSource):
    """``format("flamestream-input")``: options ``path`` (data dir or its input/), ``from`` and ``until``
    (``TS:FRONT``: events in [from, until) only), ``minPartitions``, ``maxRecordsPerPartition``."""

    @classmethod
    def name(cls) -> str:
        return "flamestream-input"

    def schema(self) -> str:
        return INPUT_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        options = self.options
        if "path" not in options:
            raise ValueError('the flamestream-input source needs option("path", <cluster data dir or its input/ dir>)')
        start = parse_time(options["from"]) if options.get("from") else None
        stop = parse_time(options["until"]) if options.get("until") else None
        return InputLogReader(options["path"], start, stop, int(options.get("minPartitions", 1)),
                              _slice_size(options))


class InputLogReader(DataSourceReader):
    def __init__(self, path: str, start: GlobalTime | None, stop: GlobalTime | None, min_partitions: int,
                 slice_size: int) -> None:
        self.path, self.start, self.stop = path, start, stop
        self.min_partitions, self.slice_size = min_partitions, slice_size

    def partitions(self) -> list[InputPartition]:
        return list(input_slices(self.path, start=self.start, stop=self.stop, min_partitions=self.min_partitions,
                                 max_records=self.slice_size))

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int, int, str]]:
        assert isinstance(partition, LogSlice)
        yield from read_input_slice(partition, self.start, self.stop)
