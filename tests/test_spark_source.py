"""The output topic as a Spark source (batch and streaming) and the exactly-once Parquet sink."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from flamestream.core.front import stamp_inputs
from flamestream.core.meta import GlobalTime
from flamestream.core.payload import encode_payload
from flamestream.spark.segments import list_segments
from flamestream.spark.source import FlamestreamSource, InputLogSource, front_logs, start_parquet_sink
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb
from tests.sparkcli import SparkCli

pytestmark = pytest.mark.slow


def write_topic(data_dir: Path, partition: int, payloads: list[Any], first_ts: int = 1000) -> None:
    """Records as a barrier appends them to its topic partition."""
    with SegmentedLog(data_dir / "topic" / str(partition)) as log:
        log.append_many([pb.Record(time=pb.GlobalTime(ts=first_ts + i, front=partition),
                                   payload=encode_payload(p)).SerializeToString() for i, p in enumerate(payloads)])


def landed(spark: Any, out: Path) -> list[tuple[int, int, int, int, Any]]:
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r.partition, r.offset, r.ts, r.front, json.loads(r.payload)) for r in rows)


def expected(data_dir: Path) -> list[tuple[int, int, int, int, Any]]:
    spark_free = []
    for partition in sorted(p for p in (data_dir / "topic").iterdir()):
        with SegmentedLog(partition, readonly=True) as log:
            for offset, data in log.scan():
                record = pb.Record.FromString(data)
                spark_free.append((int(partition.name), offset, record.time.ts, record.time.front,
                                   json.loads(record.payload)))
    return sorted(spark_free)


def test_batch_read_of_the_topic(spark: Any, tmp_path: Path) -> None:
    write_topic(tmp_path, 0, [{"word": "a", "count": i} for i in range(30)])
    write_topic(tmp_path, 1, ["x", "y"])
    spark.dataSource.register(FlamestreamSource)
    rows = spark.read.format("flamestream").option("path", str(tmp_path)).load().collect()
    assert sorted((r.partition, r.offset, json.loads(r.payload)) for r in rows) == sorted(
        [(0, i, {"word": "a", "count": i}) for i in range(30)] + [(1, 0, "x"), (1, 1, "y")])


def test_sink_stopped_mid_way_and_restarted_lands_every_record_once(spark: Any, tmp_path: Path) -> None:
    write_topic(tmp_path, 0, [{"n": i} for i in range(300)])
    write_topic(tmp_path, 1, [{"m": i} for i in range(120)])
    out, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    query = start_parquet_sink(spark, str(tmp_path), str(out), str(checkpoint), available_now=False,
                               max_records=50, trigger_seconds=0.5)
    deadline = time.monotonic() + 120
    while not any(p.get("numInputRows", 0) for p in query.recentProgress) and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()  # mid-way: a few micro-batches of 50 landed, most of the 420 records did not
    partial = landed(spark, out)
    assert 0 < len(partial) < 420
    write_topic(tmp_path, 1, [{"m": i} for i in range(120, 150)], first_ts=5000)  # the stream went on meanwhile
    start_parquet_sink(spark, str(tmp_path), str(out), str(checkpoint), max_records=50).awaitTermination(300)
    rows = landed(spark, out)
    assert rows == expected(tmp_path)  # every record, none twice
    assert len(rows) == 450 and len({(r[0], r[1]) for r in rows}) == 450


def test_cli_sink_once(tmp_path: Path, spark: Any, spark_cli: SparkCli) -> None:
    write_topic(tmp_path, 0, ["p", "q", "r"])
    done = spark_cli.run("sink", "parquet", "--topic", str(tmp_path), "--out", str(tmp_path / "t"), "--once",
                         "--master", "local[2]")
    assert done.returncode == 0, done.stderr
    assert [r[4] for r in landed(spark, tmp_path / "t")] == ["p", "q", "r"]


def test_the_input_log_as_a_source_reads_one_task_per_segment_and_prunes_by_global_time(
        spark: Any, tmp_path: Path) -> None:
    from tests.test_replay import write_input_logs

    stamped = stamp_inputs([{"n": i, "word": "мяч"} for i in range(300)], fronts=2, per_ms=3)
    write_input_logs(tmp_path, stamped, segment_bytes=1024)
    segments = sum(len(list_segments(d)) for d in front_logs(tmp_path).values())
    assert segments > 10
    spark.dataSource.register(InputLogSource)
    whole = spark.read.format("flamestream-input").option("path", str(tmp_path)).load()
    assert whole.rdd.getNumPartitions() == segments  # one task per segment: the executors read the files
    rows = whole.collect()
    assert sorted((r.front, r.ts, r.seq, json.loads(r.payload)["n"]) for r in rows) == sorted(
        (f, gt.ts, trace[0], p["n"]) for f, gt, trace, p in stamped)
    assert json.loads(rows[0].payload)["word"] == "мяч"

    start, stop = stamped[100][1], stamped[200][1]
    bounded = (spark.read.format("flamestream-input").option("path", str(tmp_path / "input"))
               .option("from", f"{start.ts}:{start.front}").option("until", f"{stop.ts}:{stop.front}").load())
    assert bounded.rdd.getNumPartitions() < segments / 2  # segments outside the interval are not even read
    assert sorted(GlobalTime(r.ts, r.front) for r in bounded.collect()) == sorted(
        gt for _, gt, _, _ in stamped if start <= gt < stop)
