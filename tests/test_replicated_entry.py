"""Replicated entry: every worker runs the stateless prefix over all inputs and keeps its own hash range."""

from __future__ import annotations

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.hashing import stable_hash
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, front_envelopes
from tests.graphfns import identity, split_csv
from tests.semanticsfns import fragile


def prefix_with_sink() -> Graph:
    """source -> split -> (sink, and a hashed hop to another sink): a prefix that reaches a sink directly."""
    g = Graph("prefix_sink")
    fork = g.source().to(g.map(split_csv, name="split")).to(g.broadcast(2, name="fork"))
    g.connect(fork.out(0), g.sink())
    g.connect(fork.out(1), g.map(identity, balance=stable_hash, name="hashed")).to(g.sink("hashed_sink"))
    return g.validate()


def test_plan_replicates_only_an_unbalanced_stateless_prefix() -> None:
    assert compile_graph(wordcount.graph()).replicated
    assert not compile_graph(inverted_index.graph()).replicated  # its entry is a grouping keyed by page


def test_every_worker_gets_every_input_and_only_the_entry_owner_emits_prefix_sinks() -> None:
    plan = compile_graph(prefix_with_sink())
    layout = Layout.even(3)
    stamped = stamp_inputs(["a,b", "c", "d,e,f"])
    inputs = [(plan.entry_balance(p), (p, gt, trace, False)) for _f, gt, trace, p in stamped]
    per_worker = front_envelopes(plan, layout, inputs)
    assert sorted(per_worker) == [0, 1, 2]
    released = []
    for index, envelopes in per_worker.items():
        remote, barrier = Worker(plan, index, layout).process(envelopes)
        assert remote == {}
        released += barrier
    oracle, _ = run_oracle(prefix_with_sink(), stamped)
    assert sorted(p for p, *_ in released) == sorted(p for _gt, p in oracle)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_dead_letters_of_the_prefix_are_emitted_once(workers: int) -> None:
    g = Graph("boom")
    g.source().to(g.map(fragile)).to(g.sink())
    inputs = list(range(8))
    result = LocalRuntime(g.validate(), workers=workers).run(inputs)
    expected, _ = run_oracle(g, stamp_inputs(inputs))
    assert sorted(map(repr, (p for _gt, _t, p in result.output))) == sorted(map(repr, (p for _gt, p in expected)))


@pytest.mark.parametrize("workers", [2, 4])
def test_word_count_bursts_from_one_front_replay_nothing(workers: int) -> None:
    """Why replicate: lines split elsewhere no longer race local words to the grouping."""
    lines = [f"w{i % 7} w{i % 3} w{i % 5} w0" for i in range(300)]
    result = LocalRuntime(wordcount.graph(), workers=workers, batch=64, seed=5).run(lines)
    expected, _ = run_oracle(wordcount.graph(), stamp_inputs(lines))
    assert sorted(map(repr, (p for _gt, _t, p in result.output))) == sorted(map(repr, (p for _gt, p in expected)))
    assert result.stats.replays == 0
