"""Audit: the stream's topic against a batch replay of the same input log.

The stream test replays on the suite's Spark session and audits the equal case there too; the audit that finds a
difference runs as a user runs it (the CLI, through tests/sparkcli.py: its report and its exit code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream.client import Client
from flamestream.core.meta import GlobalTime
from flamestream.core.payload import encode_payload
from flamestream.spark.audit import audit, audit_spark, topic_records
from flamestream.spark.replay import OUT_SCHEMA, replay
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb
from tests.sparkcli import SparkCli

ROOT = Path(__file__).resolve().parents[1]


def flamestream(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_audit_compares_multisets_by_global_time_and_payload() -> None:
    a, b = GlobalTime(1, 0), GlobalTime(2, 1)
    assert audit([(a, {"x": 1, "y": 2}), (b, "z")], [(b, "z"), (a, {"y": 2, "x": 1})]).equal  # key order is moot
    diff = audit([(a, "p"), (a, "p"), (b, "z")], [(a, "p"), (b, "q")])
    assert not diff.equal
    assert diff.only_in_topic == [((a, '"p"'), 1), ((b, '"z"'), 1)] and diff.only_in_replay == [((b, '"q"'), 1)]
    assert "only in the topic: ts=2 front=1 x1 \"z\"" in diff.verdict()


def write_topic(data_dir: Path, records: list[tuple[GlobalTime, Any]]) -> None:
    for front in sorted({gt.front for gt, _ in records}):
        with SegmentedLog(data_dir / "topic" / str(front), fsync=False) as log:
            log.append_many([pb.Record(time=pb.GlobalTime(ts=gt.ts, front=gt.front),
                                       payload=encode_payload(p)).SerializeToString()
                             for gt, p in records if gt.front == front])


@pytest.mark.slow
def test_the_spark_audit_agrees_with_the_in_memory_one(spark: Any, tmp_path: Path) -> None:
    """Counts joined full outer on the executors: duplicates, key order, both sides' surplus, first differences in
    global-time order; the same verdict as comparing the lists."""
    t = [GlobalTime(ts, ts % 2) for ts in range(40)]
    topic = [(gt, {"n": gt.ts, "k": [1, 2]}) for gt in t] + [(t[3], "dup"), (t[3], "dup"), (t[30], {"x": 1})]
    replay = [(gt, {"k": [1, 2], "n": gt.ts}) for gt in t if gt.ts != 7]
    replay += [(t[3], "dup"), (t[2], 12345678901234567890123)]  # an integer beyond 64 bits too
    write_topic(tmp_path, topic)
    rows = [(gt.ts, [0], encode_payload(p).decode(), gt.front) for gt, p in replay]
    spark.createDataFrame(rows, OUT_SCHEMA).write.partitionBy("front").parquet(str(tmp_path / "replay"))
    expected = audit(topic, replay)
    got = audit_spark(spark, tmp_path, tmp_path / "replay", show=2)
    assert (got.topic, got.replay, got.topic_surplus, got.replay_surplus) == (43, 41, 3, 1)
    assert got.only_in_topic == expected.only_in_topic[:2] and got.only_in_replay == expected.only_in_replay
    assert got.verdict(2) == expected.verdict(2)
    assert "only in the topic: ts=3 front=1 x1 \"dup\"" in got.verdict(2)
    write_topic(tmp_path / "equal", replay)
    assert audit_spark(spark, tmp_path / "equal", tmp_path / "replay").equal


def copy_topic_with_one_change(source: Path, target: Path) -> str:
    """A copy of the topic whose first record carries another payload; returns the original payload."""
    changed: str | None = None
    for partition in sorted(p for p in (source / "topic").iterdir() if p.is_dir()):
        reader = SegmentedLog(partition, readonly=True)
        writer = SegmentedLog(target / "topic" / partition.name)
        try:
            for _, data in reader.read(0, 1_000_000):
                record = pb.Record.FromString(data)
                if changed is None:
                    changed = record.payload.decode()
                    record.payload = json.dumps({"word": "tampered", "count": 1}).encode()
                writer.append(record.SerializeToString())
        finally:
            reader.close()
            writer.close()
    assert changed is not None
    return changed


@pytest.mark.slow
def test_stream_topic_audits_equal_to_replay_and_a_corrupted_record_is_shown(
        tmp_path: Path, zookeeper: str, cluster_name: str, spark: Any, spark_cli: SparkCli) -> None:
    data = tmp_path / "cluster"
    up = flamestream("up", "--nodes", "2", "--fronts", "2", "--data-dir", str(data), "--zookeeper", zookeeper,
                     "--cluster", cluster_name)
    assert up.returncode == 0, up.stderr
    try:
        assert flamestream("deploy", "examples/wordcount.py", "--data-dir", str(data)).returncode == 0
        lines = [f"to be or not to be {i % 3}" for i in range(100)]
        with Client(zookeeper, cluster_name) as client:
            client.push(lines)
            seen = 0
            for _ in client.consume(group="audit", timeout=10):  # everything released before the audit
                seen += 1
                if seen == 7 * len(lines):
                    break
        assert seen == 7 * len(lines)
    finally:
        assert flamestream("down", "--data-dir", str(data)).returncode == 0
    out = tmp_path / "replayed"
    replay(spark, data, str(out), graph=wordcount.graph(), progress=lambda line: None)
    equal = audit_spark(spark, data, out)
    assert equal.equal, equal.verdict()
    assert f"EQUAL: the topic and the replay both hold the same {7 * len(lines)}" in equal.verdict()
    assert len(topic_records(data)) == 7 * len(lines)

    old = copy_topic_with_one_change(data, tmp_path / "tampered")
    differ = spark_cli.run("audit", "--topic", str(tmp_path / "tampered"), "--replay", str(out))
    assert differ.returncode == 1
    assert "DIFFERENT" in differ.stdout and "1 only in the topic, 1 only in the replay" in differ.stdout
    assert "only in the topic" in differ.stdout and '"tampered"' in differ.stdout
    assert json.dumps(json.loads(old), sort_keys=True) in differ.stdout  # the original shows as missing
