"""Batch replay on real local Spark (local[2]), executors end to end: the input log is read by the executors,
stages run executor to executor, the records land in Parquet written by the executors — and equal the oracle.
Graphs that cannot be staged are refused; ticks and snapshots replay with the model's hand-over."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, run_oracle
from flamestream.core.front import Stamped, stamp_inputs
from flamestream.core.hashing import stable_hash
from flamestream.core.local import Handover, LocalRuntime
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout, Tick
from flamestream.spark.replay import OUT_SCHEMA, ReplayError, grouping_order, intervals_of_ticks, partition_keys, replay
from flamestream.storage.input_log import encode_record, front_log_dir
from flamestream.storage.log import SegmentedLog
from tests import randomgraph
from tests.randomgraph import Stage
from tests.sparkcli import SparkCli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def multiset(pairs: list[tuple[Any, Any]]) -> Counter[tuple[Any, str]]:
    """(global time, payload) pairs compared the way they are released: as their JSON."""
    return Counter((gt, json.dumps(p, sort_keys=True)) for gt, p in pairs)


def write_input_logs(directory: Path, stamped: list[Stamped], segment_bytes: int = 64 * 1024 * 1024) -> None:
    """Input logs exactly as fronts write them: one segmented log per front."""
    logs: dict[int, SegmentedLog] = {}
    try:
        for front, gt, trace, payload in stamped:
            if front not in logs:
                logs[front] = SegmentedLog(front_log_dir(directory, front), segment_bytes=segment_bytes, fsync=False)
            logs[front].append(encode_record(gt, trace[0], payload))
    finally:
        for log in logs.values():
            log.close()


def replayed(spark: Any, out: Path) -> list[tuple[GlobalTime, Any]]:
    """What a replay wrote (read back whole: test-sized outputs only)."""
    rows = spark.read.schema(OUT_SCHEMA).parquet(str(out)).collect()
    return [(GlobalTime(r.ts, r.front), json.loads(r.payload)) for r in rows]


def run(spark: Any, tmp_path: Path, stamped: list[Stamped], **how: Any) -> list[tuple[GlobalTime, Any]]:
    if not (tmp_path / "input").exists():
        write_input_logs(tmp_path, stamped)
    out = tmp_path / "out"
    replay(spark, tmp_path, str(out), partitions=3, progress=lambda line: None, **how)
    return replayed(spark, out)


def check(spark: Any, tmp_path: Path, graph: Graph, inputs: list[Any], fronts: int = 2) -> list[Any]:
    graph.sys_path = [str(ROOT)]  # executors import the test's business logic too
    stamped = stamp_inputs(inputs, fronts, per_ms=2)
    expected, _ = run_oracle(graph, stamped)
    got = run(spark, tmp_path, stamped, graph=graph)
    assert multiset(got) == multiset(expected)
    assert len(got) == len(expected) > 0
    return got


def test_wordcount_replay_equals_oracle(spark: Any, tmp_path: Path) -> None:
    lines = [f"the dog {i % 5} and the cat {i % 3}" for i in range(200)]
    got = check(spark, tmp_path, wordcount.graph(), lines)
    assert max(p["count"] for _, p in got if p["word"] == "the") == 400


def test_inverted_index_replay_equals_oracle_on_shared_pages(spark: Any, tmp_path: Path) -> None:
    pages = list(inverted_index.read_input(str(PAGES)))
    check(spark, tmp_path, inverted_index.graph(), pages + pages[:20])  # the repeats are new revisions


@pytest.mark.parametrize("stages", [
    [Stage("grouping", window=2, balance="mod3"), Stage("grouping", window=3, balance="mod5")],
    [Stage("reduce"), Stage("map", fn="dup", balance="mod2"), Stage("grouping", window=2, balance="ident")],
])
def test_chained_groupings_replay_equals_oracle(spark: Any, tmp_path: Path, stages: list[Stage]) -> None:
    check(spark, tmp_path, randomgraph.build(stages), [(i * 7) % 50 for i in range(80)])


@pytest.mark.parametrize("partitions", [1, 2, 3, 8, 13])
def test_each_hash_range_gets_a_spark_partition_of_its_own(spark: Any, partitions: int) -> None:
    """Stages key rows so that Spark's hash partitioning puts hash range i in partition i: none shares one."""
    from pyspark.sql import functions as F

    keys = partition_keys(partitions)
    placement = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col("owner") + 1)
    rows = (spark.range(partitions * 5).select((F.col("id") % partitions).cast("int").alias("owner"))
            .repartition(partitions, placement).select("owner", F.spark_partition_id().alias("partition")).collect())
    assert all(r["owner"] == r["partition"] for r in rows) and len(rows) == partitions * 5


def test_the_spark_extra_brings_the_pandas_pyspark_checks_for() -> None:
    """Replay and audit run ``mapInArrow``, whose driver side requires pandas; PySpark does not install it, and
    ``flamestream[spark]`` once did not either (only the bench's ``peers`` extra did), so a user who installed
    what the CLI names got PACKAGE_NOT_INSTALLED from the first replay.  The pandas installed from the extras is
    also one PySpark supports without its warning (it warns for pandas 3)."""
    from packaging.requirements import Requirement
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pandas = [r for r in map(Requirement, extras["spark"]) if r.name == "pandas"]
    assert pandas, extras["spark"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()


def test_a_cycle_through_two_groupings_is_refused_naming_the_edge() -> None:
    g = Graph("ping-pong")
    loop = g.merge(2, name="loop")
    g.source().to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=randomgraph.mod2, name="first"))
              .to(g.map(randomgraph.fold, name="fold"))
              .to(g.grouping(2, balance=randomgraph.mod3, name="second"))
              .to(g.map(randomgraph.halve_window, name="halve"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    with pytest.raises(ReplayError, match="grouping 'first' feeds grouping 'second' and is fed back by it"):
        grouping_order(compile_graph(g))


def test_a_loop_that_changes_partition_is_refused(spark: Any, tmp_path: Path) -> None:
    """One grouping in the cycle, but the looped item hashes elsewhere: its state would be split."""
    g = Graph("halving")
    loop = g.merge(2, name="loop")
    g.source().to(loop.inp(0))
    fanout = (loop.to(g.grouping(1, balance=stable_hash, name="by_value"))
              .to(g.map(randomgraph.halve_window, name="halve")).to(g.broadcast(2)))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    g.sys_path = [str(ROOT)]
    with pytest.raises(ReplayError, match="re-enters grouping 'by_value' through its cycle on another partition"):
        run(spark, tmp_path, stamp_inputs(list(range(40, 60))), graph=g)


def test_cli_replays_an_input_log_into_parquet(spark: Any, spark_cli: SparkCli, tmp_path: Path) -> None:
    lines = [f"a b {i % 4}" for i in range(60)]
    stamped = stamp_inputs(lines, fronts=2, per_ms=3)
    write_input_logs(tmp_path, stamped)
    out = tmp_path / "replayed"
    done = spark_cli.run("replay", "--graph", "examples/wordcount.py", "--input-log", str(tmp_path), "--out",
                         str(out), "--master", "local[2]")
    assert done.returncode == 0, done.stderr
    assert "replay: stage 1/1 grouping 'by_word': 180 in -> 180 released" in done.stderr  # progress is visible
    assert "replayed 60 events -> 180 records" in done.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["front=0", "front=1"]  # partitioned by front
    expected, _ = run_oracle(wordcount.graph(), stamped)
    assert multiset(replayed(spark, out)) == multiset(expected)
    missing = subprocess.run([sys.executable, "-m", "flamestream", "replay", "--graph", "examples/wordcount.py",
                              "--input-log", str(tmp_path / "nope"), "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    no_ticks = subprocess.run([sys.executable, "-m", "flamestream", "replay", "--input-log", str(tmp_path),
                               "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert no_ticks.returncode == 2 and "no --graph, and no cluster.json" in no_ticks.stderr


# -- ticks: each interval with its tick's graph, state handed over -------------------------------------------------

def counting(window: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Word count's combine, version 2: the same counts, each record tagged with its version."""
    return [dict(record, v=2) for record in wordcount.combine(window)]


def split_words(line: str) -> list[str]:
    """Word count's own functions, re-exported from this package: a graph's functions come from its own package
    (or modules the cluster allows), and wordcount_v2 lives here."""
    return wordcount.split_words(line)


def word_hash(payload: Any) -> int:
    return wordcount.word_hash(payload)


def word_of(payload: Any) -> str:
    return wordcount.word_of(payload)


def wordcount_v2() -> Graph:
    """Word count redeployed with another combine map; its grouping keeps the name 'by_word', so the counts carry
    over the redeploy."""
    g = Graph("wordcount")
    loop = g.merge(2, name="loop")
    g.source().to(g.map(split_words, name="split")).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=word_hash, equivalence=word_of, name="by_word"))
              .to(g.map(counting, name="combine"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    g.sys_path = [str(ROOT)]
    return g.validate()


def tick(number: int, start: GlobalTime, graph: Graph, workers: int = 2, previous: int | None = None) -> Tick:
    return Tick(number=number, start=start, graph=graph.to_dict(), layout=Layout.even(workers), previous=previous)


def test_replay_follows_ticks_and_carries_state_like_the_local_runtime(spark: Any, tmp_path: Path) -> None:
    lines = [f"the dog {i % 5} and the cat {i % 3}" for i in range(120)]
    stamped = stamp_inputs(lines, 2, per_ms=2)
    at = stamped[70][1]
    v1, v2 = wordcount.graph(), wordcount_v2()
    local = LocalRuntime(v1, workers=2, fronts=2, per_ms=2, seed=5,
                         handovers=[Handover(at, workers=3, graph=v2)]).run_stamped(stamped)
    expected = [(gt, p) for gt, _trace, p in local.output]
    got = run(spark, tmp_path, stamped, ticks=[tick(0, GlobalTime(0, 0), v1), tick(1, at, v2, 3, previous=0)])
    assert multiset(got) == multiset(expected)
    assert all(("v" in p) == (gt >= at) for gt, p in got)  # each interval ran its own graph
    assert max(p["count"] for gt, p in got if p["word"] == "the") == 240  # counts went on across the redeploy


def test_a_tick_that_takes_no_state_over_restarts_the_counts(spark: Any, tmp_path: Path) -> None:
    lines = [f"a b {i % 3}" for i in range(40)]
    stamped = stamp_inputs(lines, 1, per_ms=1)
    at = stamped[25][1]
    v1, v2 = wordcount.graph(), wordcount_v2()
    got = run(spark, tmp_path, stamped, ticks=[tick(0, GlobalTime(0, 0), v1), tick(1, at, v2)])
    before, _ = run_oracle(v1, [s for s in stamped if s[1] < at])
    after, _ = run_oracle(v2, [s for s in stamped if s[1] >= at])
    assert multiset(got) == multiset(before + after)


def test_a_redeploy_of_the_same_graph_replays_as_one_graph(spark: Any, tmp_path: Path) -> None:
    lines = [f"x y {i % 4}" for i in range(50)]
    stamped = stamp_inputs(lines, 2, per_ms=1)
    ticks = [tick(0, GlobalTime(0, 0), wordcount.graph()), tick(1, stamped[20][1], wordcount.graph(), 3, 0),
             tick(2, stamped[35][1], wordcount.graph(), 1, 1)]
    assert len(intervals_of_ticks(ticks)) == 1
    expected, _ = run_oracle(wordcount.graph(), stamped)
    assert multiset(run(spark, tmp_path, stamped, ticks=ticks)) == multiset(expected)


def test_intervals_of_ticks() -> None:
    v1, v2 = wordcount.graph(), wordcount_v2()
    a, b, c = GlobalTime(10, 0), GlobalTime(20, 1), GlobalTime(30, 0)
    ticks = [tick(2, c, v2, previous=1), tick(0, a, v1), tick(1, b, v2, previous=0)]
    got = intervals_of_ticks(ticks)
    assert [(i.start, i.stop, i.graph.to_json() == v2.to_json(), i.carry) for i in got] == [
        (None, b, False, False), (b, None, True, True)]
    (late,) = intervals_of_ticks(ticks, after=GlobalTime(25, 0))
    assert (late.start, late.stop, late.graph.to_json() == v2.to_json()) == (GlobalTime(25, 0), None, True)
    with pytest.raises(ReplayError, match="no ticks"):
        intervals_of_ticks([])
