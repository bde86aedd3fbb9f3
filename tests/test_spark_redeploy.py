"""Replay follows the ticks a cluster recorded: after a redeploy of another graph mid-stream (the cluster hands
its state over), the replay runs each interval with its tick's graph and carries the state the same way, so the
audit says EQUAL — while a replay of either graph alone over the whole log differs.

The replay that follows the ticks runs as a user runs it (the CLI, which finds the cluster's ZooKeeper through
DIR/cluster.json; tests/sparkcli.py); the audits and the single-graph replay run on the suite's Spark session (the
CLI's audit is tested in test_audit.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream.client import Client
from flamestream.spark.audit import audit_spark
from flamestream.spark.replay import replay
from tests.sparkcli import SparkCli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
WORDS = 7  # "to be or not to be N"


def flamestream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def second_version(directory: Path) -> Path:
    """examples/wordcount.py with another combine map (each record tagged "v": 2), same grouping name."""
    source = (ROOT / "examples" / "wordcount.py").read_text()
    old = 'return [{"word": word, "count": acc["count"] + 1}]'
    assert old in source
    path = directory / "wordcount_v2.py"
    path.write_text(source.replace(old, 'return [{"word": word, "count": acc["count"] + 1, "v": 2}]'))
    return path


def push_and_drain(zookeeper: str, cluster: str, lines: list[str], total: int) -> None:
    with Client(zookeeper, cluster) as client:
        client.push(lines)
        seen = 0
        for _ in client.consume(group="drain", timeout=20):
            seen += 1
            if seen == total:
                break
    assert seen == total


def test_audit_after_a_redeploy_of_another_graph_is_equal(tmp_path: Path, zookeeper: str, cluster_name: str,
                                                           spark: Any, spark_cli: SparkCli) -> None:
    data = tmp_path / "cluster"
    v2 = second_version(tmp_path)
    up = flamestream("up", "--nodes", "2", "--fronts", "2", "--data-dir", str(data), "--zookeeper", zookeeper,
                     "--cluster", cluster_name)
    assert up.returncode == 0, up.stderr
    try:
        assert flamestream("deploy", "examples/wordcount.py", "--data-dir", str(data)).returncode == 0
        push_and_drain(zookeeper, cluster_name, [f"to be or not to be {i % 3}" for i in range(60)], 60 * WORDS)
        redeploy = flamestream("deploy", str(v2), "--data-dir", str(data))
        assert redeploy.returncode == 0, redeploy.stderr
        # Its functions are referenced from another file now: taken over, with a word for the deployer.
        assert "flamestream: warning: the new graph's grouping(s) 'by_word' (balance 'examples.wordcount:word_hash' " \
            "-> 'wordcount_v2:word_hash'" in redeploy.stderr, redeploy.stderr
        push_and_drain(zookeeper, cluster_name, [f"to be or not to be {i % 4}" for i in range(60)], 120 * WORDS)
        # While the cluster runs, replay finds its ZooKeeper (and so its ticks) through DIR/cluster.json.
        ticks = spark_cli.run("replay", "--input-log", str(data), "--out", str(tmp_path / "ticks"),
                              "--master", "local[2]", "--partitions", "2")
        assert ticks.returncode == 0, ticks.stderr[-3000:]
        assert "interval 2/2" in ticks.stderr
    finally:
        assert flamestream("down", "--data-dir", str(data)).returncode == 0
    equal = audit_spark(spark, data, tmp_path / "ticks")
    assert equal.equal, equal.verdict(10)
    assert f"EQUAL: the topic and the replay both hold the same {120 * WORDS} records" in equal.verdict(10)

    replay(spark, data, str(tmp_path / "one"), graph=wordcount.graph(), partitions=2, progress=lambda line: None)
    differ = audit_spark(spark, data, tmp_path / "one")
    assert not differ.equal and "DIFFERENT" in differ.verdict(10)
    assert '"v": 2' in differ.verdict(10)  # the second graph's records are what a single-graph replay misses
