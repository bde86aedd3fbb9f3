"""Replicated entry: every worker runs the stateless prefix over all inputs and keeps its own hash range."""

from __future__ import annotations

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.hashing import stable_hash
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import SharedPrefix, Worker, front_envelopes
from tests.graphfns import identity, split_csv
from tests.semanticsfns import SPREAD_CALLS, fragile, picky_hash, spread


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


def spread_graph() -> Graph:
    """source -> a map that fails on some inputs -> its outputs routed by a hash that fails on some -> sink: a
    replicated entry map whose outputs are routed by hash, with dead letters of both kinds."""
    g = Graph("spread")
    g.source().to(g.map(spread, name="spread")).to(g.map(identity, balance=picky_hash, name="hashed")).to(g.sink())
    return g.validate()


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_of_one_process_run_the_entry_map_once_per_input(workers: int) -> None:
    """``SharedPrefix``: the first worker to run an input's entry map keeps what it routed for the others, so
    the map runs once, not once per worker (where it fails, every worker runs it: nothing is kept), and the
    output is still exactly the oracle's."""
    inputs = list(range(1, 40))
    expected, _ = run_oracle(spread_graph(), stamp_inputs(inputs))
    SPREAD_CALLS.clear()
    result = LocalRuntime(spread_graph(), workers=workers, seed=11, batch=4).run(inputs)
    assert {x: workers if x % 5 == 0 else 1 for x in inputs} == SPREAD_CALLS
    assert sorted(map(repr, ((gt, p) for gt, _t, p in result.output))) == sorted(map(repr, expected))
    assert sum(1 for _gt, p in expected if isinstance(p, dict) and "dead_letter" in p) > 1  # of both kinds


@pytest.mark.parametrize(("graph", "inputs"), [
    (spread_graph(), list(range(1, 25))),
    (wordcount.graph(), [f"w{i % 7} w{i % 3} w{i} w{i % 7}" for i in range(24)]),  # outputs go past the loop's merge
])
def test_a_worker_taking_what_another_routed_emits_what_it_would_have(graph: Graph, inputs: list[object]) -> None:
    """Three workers given one front's envelopes: with a ``SharedPrefix`` each emits and keeps exactly what it
    does alone (payloads, traces, order), and nothing is held once all three took every input."""
    plan = compile_graph(graph)
    layout = Layout.even(3)
    stamped = stamp_inputs(inputs)
    envelopes = [(plan.entry_balance(p), (p, gt, trace, False)) for _f, gt, trace, p in stamped]
    per_worker = front_envelopes(plan, layout, envelopes)
    shared = SharedPrefix(3)
    SPREAD_CALLS.clear()
    for index in (2, 0, 1):  # not in index order: the first to run an input need not own its entry hash
        alone = Worker(plan, index, layout).process(per_worker[index])
        assert Worker(plan, index, layout, shared=shared).process(per_worker[index]) == alone
    assert len(shared) == 0
    if graph.name == "spread":  # three workers alone, then once for the three sharing, or once each where it fails
        assert {x: 6 if x % 5 == 0 else 4 for x in range(1, 25)} == SPREAD_CALLS


def test_a_worker_with_a_cut_refuses_to_share() -> None:
    """It would never take what the others keep for it, and they would hold every input for good."""
    plan = compile_graph(wordcount.graph())
    with pytest.raises(ValueError, match="cut"):
        Worker(plan, 0, Layout.even(2), frozenset({1}), shared=SharedPrefix(2))
