"""Replay from a snapshot: the grouping state of a complete snapshot, then only the log after its boundary — so a
replay still works once the log before it is gone (retention).  A damaged or incomplete snapshot is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, run_oracle
from flamestream.core.front import Stamped, stamp_inputs
from flamestream.core.local import Handover, LocalRuntime
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick
from flamestream.spark.replay import ReplayError, replay
from flamestream.spark.segments import list_segments, read_range
from flamestream.storage.input_log import decode_record
from flamestream.storage.snapshots import snapshot_dir, snapshot_path, write_snapshot
from tests.sparkcli import SparkCli
from tests.test_replay import PAGES, multiset, replayed, write_input_logs

pytestmark = pytest.mark.slow


def take_snapshot(data_dir: Path, graph: Graph, stamped: list[Stamped], at: GlobalTime, workers: int = 2) -> Path:
    """What the cluster's workers write at a hand-over at ``at``: each its hash range's share of the state."""
    result = LocalRuntime(graph, workers=3, fronts=2, per_ms=2, seed=2,
                          handovers=[Handover(at, workers=workers)]).run_stamped(stamped)
    ((boundary, state),) = result.handed_over
    assert boundary == at and any(state.values())
    layout = Layout.even(workers)
    for i in range(workers):
        share = {name: [b for b in buckets if layout.owner(b[0]) == i] for name, buckets in state.items()}
        write_snapshot(snapshot_path(data_dir, at, i), share, boundary=at, worker=i, tick=0)
    return snapshot_dir(data_dir, at)


def drop_log_before(data_dir: Path, at: GlobalTime) -> int:
    """Retention: remove every input-log segment whose records all precede ``at``; returns how many went."""
    dropped = 0
    for front in sorted((data_dir / "input").iterdir()):
        for segment in list_segments(front)[:-1]:
            times = [GlobalTime(r["ts"], r["front"]) for r in
                     (decode_record(data) for _, data in read_range(front, segment.base, segment.base, segment.end))]
            if max(times) >= at:
                break
            (front / f"{segment.base:020d}.log").unlink()
            (front / f"{segment.base:020d}.index").unlink()
            dropped += 1
    return dropped


@pytest.mark.parametrize("graph, inputs", [
    (wordcount.graph(), [f"the dog {i % 5} and the cat {i % 3}" for i in range(150)]),
    (inverted_index.graph(), [dict(page, text=page["text"] + " правка" * r)  # revisions: two chained groupings
                              for r in range(2) for page in list(inverted_index.read_input(str(PAGES)))[:40]]),
], ids=["wordcount", "inverted-index"])
def test_replay_from_a_snapshot_after_retention_equals_the_oracle_after_it(
        spark: Any, tmp_path: Path, graph: Graph, inputs: list[Any]) -> None:
    stamped = stamp_inputs(inputs, 2, per_ms=2)
    at = stamped[len(stamped) * 2 // 3][1]
    write_input_logs(tmp_path, stamped, segment_bytes=2048)
    snapshot = take_snapshot(tmp_path, graph, stamped, at)
    assert drop_log_before(tmp_path, at) > 2  # the log before the snapshot is (mostly) gone
    out = tmp_path / "out"
    result = replay(spark, tmp_path, str(out), graph=graph, snapshot=snapshot, partitions=3,
                    progress=lambda line: None)
    expected, _ = run_oracle(graph, stamped)
    after = [(gt, p) for gt, p in expected if gt >= at]
    assert multiset(replayed(spark, out)) == multiset(after)
    assert result.events == sum(1 for s in stamped if s[1] >= at)


def test_a_damaged_or_incomplete_snapshot_is_refused(spark: Any, spark_cli: SparkCli, tmp_path: Path) -> None:
    lines = [f"a b {i % 3}" for i in range(30)]
    stamped = stamp_inputs(lines, 2, per_ms=2)
    at = stamped[15][1]
    write_input_logs(tmp_path, stamped)
    snapshot = take_snapshot(tmp_path, wordcount.graph(), stamped, at)

    def attempt(**how: Any) -> None:
        replay(spark, tmp_path, str(tmp_path / "out"), snapshot=snapshot, partitions=2, progress=lambda line: None,
               **({"graph": wordcount.graph()} | how))

    ticks = [Tick(number=0, start=GlobalTime(0, 0), graph=wordcount.graph().to_dict(), layout=Layout.even(3))]
    with pytest.raises(ReplayError, match=r"incomplete: 2 files for the 3 workers of tick 0"):
        attempt(graph=None, ticks=ticks)
    damaged = snapshot / "worker-1.snap"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ReplayError, match=r"refusing to replay from a damaged snapshot: .*worker-1\.snap is corrupted"):
        attempt()
    (snapshot / "worker-0.snap").unlink()
    with pytest.raises(ReplayError, match=r"incomplete: no file of worker\(s\) \[0\]"):
        attempt()

    done = spark_cli.run("replay", "--graph", "examples/wordcount.py", "--input-log", str(tmp_path), "--out",
                         str(tmp_path / "cli"), "--master", "local[1]", "--from-snapshot", str(snapshot))
    assert done.returncode == 2 and "incomplete: no file of worker(s) [0]" in done.stderr, done.stderr
