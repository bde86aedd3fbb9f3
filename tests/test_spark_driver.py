"""Replay and audit keep data off the driver: both run with a ``spark.driver.maxResultSize`` far below the size of
what they replay and compare, which fails any job that collects those rows (shown on the same output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index
from flamestream import run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.payload import encode_payload
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb
from tests.sparkcli import SparkCli
from tests.test_replay import PAGES, write_input_logs

pytestmark = pytest.mark.slow
LIMIT = "1m"  # Spark's smallest allowed limit


def write_topic(data_dir: Path, records: list[tuple[Any, Any]]) -> int:
    """The topic a barrier per front would have written for these (global time, payload) records; its bytes."""
    size = 0
    by_front: dict[int, list[bytes]] = {}
    for gt, payload in records:
        data = pb.Record(time=pb.GlobalTime(ts=gt.ts, front=gt.front), payload=encode_payload(payload))
        by_front.setdefault(gt.front, []).append(data.SerializeToString())
        size += len(by_front[gt.front][-1])
    for front, batch in by_front.items():
        with SegmentedLog(data_dir / "topic" / str(front), fsync=False) as log:
            log.append_many(batch)
    return size


def test_replay_and_audit_collect_no_rows_to_the_driver(tmp_path: Path, spark_cli: SparkCli) -> None:
    pages = list(inverted_index.read_input(str(PAGES)))
    stamped = stamp_inputs(pages, 2, per_ms=1)
    data = tmp_path / "cluster"
    write_input_logs(data, stamped)
    expected, _ = run_oracle(inverted_index.graph(), stamped)
    assert write_topic(data, expected) > 6_000_000  # 6x the limit: a collect of either side would fail
    out = tmp_path / "replayed"
    limited = ["--master", "local[2]", "--conf", f"spark.driver.maxResultSize={LIMIT}"]
    replayed = spark_cli.run("replay", "--graph", "examples/inverted_index.py", "--input-log", str(data), "--out",
                             str(out), "--partitions", "2", *limited)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert f"replayed {len(pages)} events -> {len(expected)} records" in replayed.stderr
    audited = spark_cli.run("audit", "--topic", str(data), "--replay", str(out), *limited)
    assert audited.returncode == 0, audited.stderr[-3000:]
    assert f"EQUAL: the topic and the replay both hold the same {len(expected)} records" in audited.stdout
    collected = spark_cli.collect(out, {"spark.driver.maxResultSize": LIMIT})
    assert collected.returncode != 0 and "maxResultSize" in collected.stderr  # the limit does bite a collect
