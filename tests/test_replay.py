"""Batch replay on real local Spark (local[2]) equals the oracle; graphs that cannot be staged are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.hashing import stable_hash
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph
from flamestream.spark.replay import ReplayError, grouping_order, replay
from flamestream.storage.input_log import encode_record, front_log_dir
from flamestream.storage.log import SegmentedLog
from tests import randomgraph
from tests.randomgraph import Stage

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


def multiset(pairs: list[tuple[Any, Any]]) -> Counter[tuple[Any, str]]:
    return Counter((gt, repr(p)) for gt, p in pairs)


def check(spark: Any, graph: Graph, inputs: list[Any], fronts: int = 2) -> list[Any]:
    graph.sys_path = [str(ROOT)]  # executors import the test's business logic too
    stamped = stamp_inputs(inputs, fronts, per_ms=2)
    expected, _ = run_oracle(graph, stamped)
    released = replay(spark, graph, stamped, partitions=3, progress=lambda line: None)
    assert multiset([(gt, p) for gt, _, p in released]) == multiset(expected)
    assert len(released) == len(expected) > 0
    return released


def test_wordcount_replay_equals_oracle(spark: Any) -> None:
    lines = [f"the dog {i % 5} and the cat {i % 3}" for i in range(200)]
    released = check(spark, wordcount.graph(), lines)
    assert max(p["count"] for _, _, p in released if p["word"] == "the") == 400


def test_inverted_index_replay_equals_oracle_on_shared_pages(spark: Any) -> None:
    pages = list(inverted_index.read_input(str(PAGES)))
    check(spark, inverted_index.graph(), pages + pages[:20])  # the repeats are new revisions of the same pages


@pytest.mark.parametrize("stages", [
    [Stage("grouping", window=2, balance="mod3"), Stage("grouping", window=3, balance="mod5")],
    [Stage("reduce"), Stage("map", fn="dup", balance="mod2"), Stage("grouping", window=2, balance="ident")],
])
def test_chained_groupings_replay_equals_oracle(spark: Any, stages: list[Stage]) -> None:
    check(spark, randomgraph.build(stages), [(i * 7) % 50 for i in range(80)])


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


def test_a_loop_that_changes_partition_is_refused(spark: Any) -> None:
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
        replay(spark, g, stamp_inputs(list(range(40, 60))), partitions=3, progress=lambda line: None)


def write_input_logs(directory: Path, stamped: list[Any]) -> None:
    """Input logs exactly as fronts write them: one segmented log per front."""
    logs: dict[int, SegmentedLog] = {}
    try:
        for front, gt, trace, payload in stamped:
            if front not in logs:
                logs[front] = SegmentedLog(front_log_dir(directory, front))
            logs[front].append(encode_record(gt, trace[0], payload))
    finally:
        for log in logs.values():
            log.close()


def test_cli_replays_an_input_log_into_parquet(spark: Any, tmp_path: Path) -> None:
    lines = [f"a b {i % 4}" for i in range(60)]
    stamped = stamp_inputs(lines, fronts=2, per_ms=3)
    write_input_logs(tmp_path, stamped)
    out = tmp_path / "replayed"
    done = subprocess.run([sys.executable, "-m", "flamestream", "replay", "--graph", "examples/wordcount.py",
                           "--input-log", str(tmp_path), "--out", str(out), "--master", "local[2]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "replay: stage 1/1 grouping 'by_word'" in done.stderr  # progress is visible
    rows = spark.read.parquet(str(out)).collect()
    got = [(GlobalTime(r.ts, r.front), json.loads(r.payload)) for r in rows]
    expected, _ = run_oracle(wordcount.graph(), stamped)
    assert multiset(got) == multiset(expected)
    missing = subprocess.run([sys.executable, "-m", "flamestream", "replay", "--graph", "examples/wordcount.py",
                              "--input-log", str(tmp_path / "nope"), "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
