"""Replay and audit keep data off the driver: both run with a ``spark.driver.maxResultSize`` far below the size of
what they replay and compare, which fails any job that collects those rows (shown on the same output).

The two CLI commands and the collect run one after another in one Python process (``SESSION``): each command starts
and stops its own Spark session, as from a shell, but on the JVM the first one started — warm, a Spark session
starts in ~12 s instead of ~40 s on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index
from flamestream import run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.payload import encode_payload
from flamestream.storage.log import SegmentedLog
from flamestream.wire import flamestream_pb2 as pb
from tests.test_replay import PAGES, ROOT, write_input_logs

pytestmark = pytest.mark.slow
LIMIT = "1m"  # Spark's smallest allowed limit
SESSION = """\
import contextlib, io, json, sys
from flamestream.cli import main
from flamestream.spark.replay import spark_session

commands, table, limit = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
results = []
for args in commands:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--master", "local[2]", "--conf", f"spark.driver.maxResultSize={limit}"])
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
session = spark_session("local[2]", "collect", {"spark.driver.maxResultSize": limit})
try:
    session.read.parquet(table).collect()
    results.append({"code": 0, "stdout": "", "stderr": ""})
except Exception as exc:
    results.append({"code": 1, "stdout": "", "stderr": str(exc)})
print(json.dumps(results))
"""
"""Runs ``flamestream`` commands (argv[1], JSON), then collects the Parquet table argv[2], each with the driver's
result size limited to argv[3]; prints each one's exit code, stdout and stderr."""


def in_one_process(commands: list[list[str]], table: Path) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-c", SESSION, json.dumps(commands), str(table), LIMIT], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


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


def test_replay_and_audit_collect_no_rows_to_the_driver(tmp_path: Path) -> None:
    pages = list(inverted_index.read_input(str(PAGES)))
    stamped = stamp_inputs(pages, 2, per_ms=1)
    data = tmp_path / "cluster"
    write_input_logs(data, stamped)
    expected, _ = run_oracle(inverted_index.graph(), stamped)
    assert write_topic(data, expected) > 6_000_000  # 6x the limit: a collect of either side would fail
    out = tmp_path / "replayed"
    replayed, audited, collected = in_one_process(
        [["replay", "--graph", "examples/inverted_index.py", "--input-log", str(data), "--out", str(out),
          "--partitions", "2"],
         ["audit", "--topic", str(data), "--replay", str(out)]], out)
    assert replayed["code"] == 0, replayed["stderr"][-3000:]
    assert f"replayed {len(pages)} events -> {len(expected)} records" in replayed["stderr"]
    assert audited["code"] == 0, audited["stderr"][-3000:]
    assert f"EQUAL: the topic and the replay both hold the same {len(expected)} records" in audited["stdout"]
    assert collected["code"] != 0 and "maxResultSize" in collected["stderr"]  # the limit does bite a collect
