"""The Spark Structured Streaming peer runs both benchmark workloads and matches the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flamestream.bench.harness import RunSpec
from flamestream.bench.runner import run


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "rate"), [("wordcount", 50.0), ("inverted-index", 5.0)])
def test_spark_peer_completes_every_event_and_matches_the_oracle(spark: Any, tmp_path: Path, workload: str,
                                                                 rate: float) -> None:
    # The fixture's session is running, so the system attaches to it and must leave it running.
    result = run(RunSpec(workload=workload, system="spark", rate=rate, duration=2.0, seed=7, workers=2,
                         exactly_once=True, workdir=tmp_path, drain_timeout=120.0))
    assert result["events_pushed"] > 0
    assert result["events_completed"] == result["events_pushed"]
    assert result["correct"], result["check"]
    assert result["p50_ms"] is not None
    sunk = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in (tmp_path / "out").glob("batch-*.jsonl"))
    assert sunk == result["records_consumed"]
    assert spark.range(3).count() == 3
