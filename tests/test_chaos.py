"""The chaos bench in CI (issue #11): 60 s of word count on a process per role, a random process killed with
kill -9 (or ZooKeeper stopped for a few seconds) every 15 s, and the topic checked exactly at the end.

A modest rate, so a loaded 2-core CI box keeps up; ``bench/chaos.py`` runs the
long version for the README's numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import chaos

pytestmark = pytest.mark.slow


def test_a_minute_of_chaos_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = chaos.run(workload_name="wordcount", duration=60, interval=15, rate=100, seed=1, placement="separate",
                       zookeeper_pause=3, snapshot_interval_ms=500, work=tmp_path, drain=240)
    summary = {key: report[key] for key in ("faults", "lost", "duplicated", "unrecovered", "errors",
                                            "records_checked", "oracle_records", "examples")}
    assert report["kills"] + report["zookeeper_pauses"] == 3, summary
    assert report["kills"] >= 1, summary  # the seed picks at least one process to kill
    assert report["unrecovered"] == 0 and not report["errors"], summary
    assert report["lost"] == 0 and report["duplicated"] == 0, summary
    assert report["counts_1_to_n"], summary
    assert report["records_checked"] == report["oracle_records"] > 0, summary
    assert report["events_done"] == report["events_pushed"], summary
