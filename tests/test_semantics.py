"""Paper examples and system-level semantics, checked on the oracle and the local runtime."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from examples import wordcount
from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.core.dead_letter import is_dead_letter
from flamestream.core.front import stamp_inputs
from flamestream.core.grouping import Grouping
from flamestream.core.local import YOUNG_EVERY
from flamestream.core.meta import GlobalTime
from tests import semanticsfns as fns

SEEDS = [(1, 0, False), (3, 1, False), (4, 2, True), (2, 3, True)]


def payloads(result: Any) -> list[Any]:
    return [p for _gt, _trace, p in result.output]


def paper_grouping_graph() -> Graph:
    g = Graph("paper-grouping")
    g.source().to(g.grouping(3, balance=fns.parity)).to(g.sink())
    return g


@pytest.mark.parametrize(("workers", "seed", "adversarial"), SEEDS)
def test_paper_grouping_example(workers: int, seed: int, adversarial: bool) -> None:
    """§2.5: numbers by parity, window 3 -> (1),(2),(1|3),(2|4),(1|3|5),(2|4|6),(3|5|7),(4|6|8)."""
    expected = [(1,), (2,), (1, 3), (2, 4), (1, 3, 5), (2, 4, 6), (3, 5, 7), (4, 6, 8)]
    graph = paper_grouping_graph()
    assert [p for _, p in run_oracle(graph, stamp_inputs(list(range(1, 9))))[0]] == expected
    result = LocalRuntime(graph, workers=workers, fronts=2, seed=seed, adversarial=adversarial, batch=3).run(
        range(1, 9))
    assert payloads(result) == expected  # released in meta order, i.e. input order here


def test_wordcount_walkthrough_figure_6() -> None:
    """§2.7 figure 6: two "dog" items through grouping(window 2) + combine, stage by stage."""
    grouping = Grouping(2)
    key = wordcount.word_hash("dog")
    gt1, gt2 = GlobalTime(1, 0), GlobalTime(2, 0)
    # (1) m[dog] meets an empty bucket -> (m) -> a[dog, 1]
    (t1,) = grouping.accept(key, ("dog", gt1, (0, 0), False))
    assert t1[0] == ("dog",)
    (a1,) = wordcount.combine(t1[0])
    assert a1 == {"word": "dog", "count": 1}
    # (2) a[dog, 1] comes back through the cycle -> (m, a) -> dropped by combine
    (t2,) = grouping.accept(key, (a1, gt1, t1[2] + (0, 0), False))
    assert t2[0] == ("dog", a1)
    assert wordcount.combine(t2[0]) == []
    # (3) the next m[dog] is placed after the accumulator -> (a, m) -> a[dog, 2]
    (t3,) = grouping.accept(key, ("dog", gt2, (0, 0), False))
    assert t3[0] == (a1, "dog")
    (a2,) = wordcount.combine(t3[0])
    assert a2 == {"word": "dog", "count": 2}
    # (4) a[dog, 2] returns -> (m, a) -> dropped
    (t4,) = grouping.accept(key, (a2, gt2, t3[2] + (0, 0), False))
    assert wordcount.combine(t4[0]) == []
    assert grouping.replays == 0


def running_sum_graph() -> Graph:
    g = Graph("running-sum")
    loop = g.merge(2)
    g.source().to(g.map(fns.as_mapped)).to(loop.inp(0))
    fanout = loop.to(g.grouping(2, balance=fns.zero)).to(g.map(fns.running_sum)).to(g.broadcast(2))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g


@pytest.mark.parametrize(("workers", "seed", "adversarial"), SEEDS)
def test_running_sum_over_a_cycle(workers: int, seed: int, adversarial: bool) -> None:
    values = [(i * 37) % 101 for i in range(120)]
    result = LocalRuntime(running_sum_graph(), workers=workers, fronts=3, per_ms=2, seed=seed,
                          adversarial=adversarial, batch=5).run(values)
    sums = [p[1] for p in payloads(result)]
    assert len(sums) == len(values)
    assert sums[-1] == sum(values)
    assert sums == sorted(sums)  # released in meta order, a running sum of non-negatives never drops


def test_failing_user_function_becomes_dead_letter_not_a_dead_worker() -> None:
    g = Graph("fragile")
    g.source().to(g.map(fns.fragile, balance=fns.picky_hash)).to(g.map(fns.identity, balance=fns.parity)).to(g.sink())
    inputs = [1, 5, 7, 10, 11, -3]
    expected, rejected = run_oracle(g, stamp_inputs(inputs, 2))
    result = LocalRuntime(g, workers=3, fronts=2, seed=4).run(inputs)
    assert sorted(map(repr, payloads(result))) == sorted(repr(p) for _, p in expected)
    assert rejected == result.rejected == [-3]  # the entry balancing function failed: refused at the front
    letters = [p["dead_letter"] for p in payloads(result) if is_dead_letter(p)]
    assert [(d["operation"], d["payload"]) for d in letters] == [("map0", "5"), ("map0", "10")]
    assert letters[0]["error"] == "ValueError: cannot handle 5"
    assert [p for p in payloads(result) if not is_dead_letter(p)] == [1, 7, 11]


def test_grouping_state_is_trimmed_as_min_time_passes() -> None:
    """Word count over 20 words: once min time passes, each word keeps only its last accumulator.

    Without trimming the buckets would hold two items per occurrence (mapped + accumulator).
    """
    line = " ".join(f"w{i}" for i in range(20))
    for lines in (50, 500):
        result = LocalRuntime(wordcount.graph(), workers=2, fronts=2, seed=1, batch=4).run([line] * lines)
        assert len(result.output) == 20 * lines
        assert result.stats.final_state == 20
        assert result.stats.peak_state < 2 * 20 * lines


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_pauses_the_collector_collects_only_the_young_and_leaves_it_as_it_found_it(enabled: bool) -> None:
    """The collector's automatic passes cost the runtime 10-15 % and found nothing (see ``YOUNG_EVERY``): a run
    pauses them, collects the youngest generation every ``YOUNG_EVERY`` steps (cycles business logic makes are
    still freed), and leaves the collector on or off as it was."""
    started: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    runtime, stamped = LocalRuntime(wordcount.graph(), seed=1), stamp_inputs(["a b"] * 70000)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.callbacks.append(note)
    try:
        result = runtime.run_stamped(stamped)
        after = gc.isenabled()
    finally:
        gc.callbacks.remove(note)
        (gc.enable if was else gc.disable)()
    assert after is enabled
    assert result.stats.steps >= 2 * YOUNG_EVERY
    assert started == [0] * (result.stats.steps // YOUNG_EVERY)


def test_a_worker_step_takes_every_batch_its_channels_hold() -> None:
    """As a worker service takes its whole inbox (``flamestream.core.local``).  With a front injecting one event a
    step (the default ``batch``), a step per batch takes at least three scheduler steps per event on one worker:
    the front's that injects it, the worker's that takes it and the barrier's that takes what it made; meanwhile the
    events queued behind stay in flight."""
    lines = 2000
    result = LocalRuntime(wordcount.graph(), seed=1).run(["a b"] * lines)
    assert len(result.output) == 2 * lines
    assert result.stats.steps < 3 * lines
