"""A merge's mark on the trace is the same whether the merge runs as an operation or the worker routes past it.

The worker sends items straight past unbalanced merges (``worker._past_merges``), adding the marks the merges
would have added; a merge with a balancing function is routed to by hash and runs as an operation.  The same
graph both ways must release the same items with the same traces, whichever way items reach a merge — a
map's outputs (a few, and more than the 256 whose marks are prebuilt), a map's only output, a grouping's
windows and retractions, a broadcast's copies, merges in a row — and whatever follows it: a grouping, a
broadcast, a map, a sink.  What a worker sends to other workers past a merge is what it sends without it.
"""

from __future__ import annotations

import pytest

from examples import wordcount
from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.graph import Node
from flamestream.core.meta import decode
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, front_envelopes
from tests.graphfns import identity, split_words, word_hash
from tests.semanticsfns import zero

LINES = ["a b a", "c", "b b c a", " ".join(f"w{i % 40}" for i in range(300)), "a", "d c b a"]


def reduce_through_merges(balanced: bool) -> Graph:
    """Word count with a merge after each step that can feed one; ``balanced`` gives every merge a balancing
    function, so each runs as an operation (one worker: every hash is its own)."""
    g = Graph("merges")
    balance = zero if balanced else None

    def merge(name: str, inputs: int = 1) -> Node:
        return g.merge(inputs, balance=balance, name=name)

    loop = merge("loop", 2)
    g.source().to(g.map(wordcount.split_words, name="split")).to(merge("pre")).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=wordcount.word_hash, equivalence=wordcount.word_of, name="by_word"))
              .to(merge("windows"))
              .to(g.map(wordcount.combine, name="combine"))
              .to(merge("post"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), merge("out")).to(g.map(identity, name="id")).to(merge("last")).to(g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g.validate()


@pytest.mark.parametrize("seed", [0, 1])
def test_routing_past_merges_releases_what_running_them_does(seed: int) -> None:
    passed, run = (LocalRuntime(reduce_through_merges(balanced), workers=1, seed=seed, batch=3).run(LINES).output
                   for balanced in (False, True))
    assert passed == run
    oracle, _ = run_oracle(reduce_through_merges(False), stamp_inputs(LINES))
    assert [(gt, p) for gt, _, p in passed] == oracle
    # The front's mark, then split, pre, loop, by_word, windows, combine, post, fanout, out, id and last.
    first = next(trace for _, trace, p in passed if p == {"word": "a", "count": 1})
    assert [(lt.logical_time > 0, lt.child_id) for lt in decode(first)] == [(False, 0)] * 4 + [(True, 0)] + [
        (False, 0)] * 7


@pytest.mark.parametrize("workers", [2, 3])
def test_routing_past_merges_on_several_workers_gives_the_oracles_output(workers: int) -> None:
    """Replicated copies, remote routing and replays past merges (adversarial delivery): the oracle's records."""
    result = LocalRuntime(reduce_through_merges(False), workers=workers, seed=workers, batch=3,
                          adversarial=True).run(LINES)
    oracle, _ = run_oracle(reduce_through_merges(False), stamp_inputs(LINES))
    assert sorted(repr((gt, p)) for gt, _, p in result.output) == sorted(repr(record) for record in oracle)


def rekeyed_words(through_merge: bool) -> Graph:
    """Lines by hash to a split (a balanced entry: not replicated), its words by hash to a map, then all to one
    grouping; ``through_merge`` puts a merge between the split and the map."""
    g = Graph("rekeyed")
    split = g.source().to(g.map(split_words, balance=word_hash, name="split"))
    if through_merge:
        split = split.to(g.merge(1, name="pass"))
    split.to(g.map(identity, balance=word_hash, name="rekey")).to(g.grouping(2, balance=zero, name="all")).to(g.sink())
    return g.validate()


def test_a_merge_changes_what_a_worker_sends_in_nothing_but_traces() -> None:
    """With or without a merge in between, a worker sends the same items to the same operations of the same
    workers in the same order: a map's outputs are routed together either way (words kept here are processed
    after the others left, and what they lead to leaves after those)."""
    lines = [" ".join(f"w{i}" for i in range(k, k + 12)) for k in range(0, 60, 12)]
    layout = Layout.even(2)
    sent: dict[bool, list[object]] = {}
    for through_merge in (False, True):
        plan = compile_graph(rekeyed_words(through_merge))
        inputs = [(plan.entry_balance(p), (p, gt, trace, False)) for _f, gt, trace, p in stamp_inputs(lines)]
        sent[through_merge] = [
            [(worker, dst, plan.names[op], h, payload, gt) for dst, envelopes in sorted(remote.items())
             for op, h, (payload, gt, _trace, _tomb) in envelopes]
            for worker, envelopes in sorted(front_envelopes(plan, layout, inputs).items())
            for remote, _ in [Worker(plan, worker, layout).process(envelopes)]]
    assert sent[True] == sent[False]
    assert {name for per_worker in sent[True] for _, _, name, *_ in per_worker} == {"rekey", "all"}
