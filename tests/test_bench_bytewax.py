"""The Bytewax peer completes every event and matches the sequential oracle record for record.

Two workers, so words are shuffled between Bytewax workers: the changelog
check then shows that each word's updates still apply in push order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flamestream.bench.harness import RunSpec
from flamestream.bench.runner import run

pytest.importorskip("bytewax")


@pytest.mark.parametrize(("workload", "rate"), [("wordcount", 100.0), ("inverted-index", 5.0)])
def test_bytewax_matches_the_oracle(workload: str, rate: float, tmp_path: Path) -> None:
    result = run(RunSpec(workload=workload, system="bytewax", rate=rate, duration=2.0, seed=7, workers=2,
                         exactly_once=False, workdir=tmp_path, drain_timeout=30.0))
    assert result["events_pushed"] > 0
    assert result["events_completed"] == result["events_pushed"]
    assert result["correct"], result["check"]
    assert result["check"]["method"] == "changelog"
    assert result["version"].startswith("Bytewax 0.")
