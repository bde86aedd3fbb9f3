"""A real Spark cluster: a standalone master and one worker on loopback (the pyspark package's own launcher).
``flamestream replay --master spark://…`` equals the local replay (on the suite's session) and the oracle,
``flamestream audit`` against it says EQUAL, and ``flamestream sink parquet`` lands the topic through it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index
from flamestream import run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.spark.replay import replay
from flamestream.spark.standalone import StandaloneCluster
from tests.sparkcli import SparkCli
from tests.test_replay import PAGES, multiset, replayed, write_input_logs
from tests.test_spark_driver import write_topic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), cores=2, memory="2g") as standalone:
        yield standalone


def test_standalone_cluster_replay_equals_local_replay(cluster: StandaloneCluster, spark: Any, spark_cli: SparkCli,
                                                        tmp_path: Path) -> None:
    pages = list(inverted_index.read_input(str(PAGES)))[:80]
    revised = [dict(page, text=page["text"] + " правка") for page in pages[:30]]
    stamped = stamp_inputs(pages + revised, 2, per_ms=2)
    data = tmp_path / "cluster"
    write_input_logs(data, stamped)
    expected, _ = run_oracle(inverted_index.graph(), stamped)
    write_topic(data, expected)
    standalone, local, table = tmp_path / "standalone", tmp_path / "local", tmp_path / "table"
    on = ["--master", cluster.url]
    replay_run = spark_cli.run("replay", "--graph", "examples/inverted_index.py", "--input-log", str(data), "--out",
                               str(standalone), "--partitions", "3", *on)
    assert replay_run.returncode == 0, replay_run.stderr[-3000:]
    assert "flamestream-replay" in [app["name"] for app in cluster.status()["completedapps"]]  # ran on the cluster
    replay(spark, data, str(local), graph=inverted_index.graph(), partitions=3, progress=lambda line: None)
    on_cluster = replayed(spark, standalone)
    assert multiset(on_cluster) == multiset(replayed(spark, local))
    assert multiset(on_cluster) == multiset(expected)

    audit_run = spark_cli.run("audit", "--topic", str(data), "--replay", str(standalone), *on)
    assert audit_run.returncode == 0, audit_run.stderr[-3000:]
    assert f"EQUAL: the topic and the replay both hold the same {len(expected)} records" in audit_run.stdout

    sink_run = spark_cli.run("sink", "parquet", "--topic", str(data), "--out", str(table), "--once", *on)
    assert sink_run.returncode == 0, sink_run.stderr[-3000:]
    rows = spark.read.parquet(str(table)).collect()
    assert multiset([((r.ts, r.front), json.loads(r.payload)) for r in rows]) == multiset(
        [((gt.ts, gt.front), p) for gt, p in expected])
