"""A merge's mark on the trace is the same whether the merge runs as an operation or the worker routes past it.

The worker sends items straight past unbalanced merges (``worker._past_merges``), adding the marks the merges
would have added; a merge with a balancing function is routed to by hash and runs as an operation.  The same
graph both ways must release the same items with the same traces, on every path an item can take into a
merge: a map's outputs (a few, and more than the 256 whose marks are prebuilt), a broadcast's copies, a map's
only output, merges in a row, and merges in front of a map, a grouping and a sink.
"""

from __future__ import annotations

import pytest

from examples import wordcount
from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs
from flamestream.core.meta import decode
from tests.graphfns import identity
from tests.semanticsfns import zero

LINES = ["a b a", "c", "b b c a", " ".join(f"w{i % 40}" for i in range(300)), "a", "d c b a"]


def reduce_through_merges(balanced: bool) -> Graph:
    """Word count with a merge after each step that can feed one; ``balanced`` gives every merge a balancing
    function, so each runs as an operation (one worker: every hash is its own)."""
    g = Graph("merges")
    balance = zero if balanced else None

    def merge(name: str, inputs: int = 1) -> object:
        return g.merge(inputs, balance=balance, name=name)

    loop = merge("loop", 2)
    g.source().to(g.map(wordcount.split_words, name="split")).to(merge("pre")).to(loop.inp(0))
    fanout = (loop.to(g.grouping(2, balance=wordcount.word_hash, equivalence=wordcount.word_of, name="by_word"))
              .to(g.map(wordcount.combine, name="combine"))
              .to(merge("post"))
              .to(g.broadcast(2, name="fanout")))
    g.connect(fanout.out(0), merge("out")).to(g.map(identity, name="id")).to(g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g.validate()


@pytest.mark.parametrize("seed", [0, 1])
def test_routing_past_merges_releases_what_running_them_does(seed: int) -> None:
    passed, run = (LocalRuntime(reduce_through_merges(balanced), workers=1, seed=seed, batch=3).run(LINES).output
                   for balanced in (False, True))
    assert passed == run
    oracle, _ = run_oracle(reduce_through_merges(False), stamp_inputs(LINES))
    assert [(gt, p) for gt, _, p in passed] == oracle
    # The front's mark, then split, pre, loop, by_word, combine, post, fanout, out and id: four merges' marks.
    first = next(trace for _, trace, p in passed if p == {"word": "a", "count": 1})
    assert [(lt.logical_time > 0, lt.child_id) for lt in decode(first)] == [(False, 0)] * 4 + [(True, 0)] + [
        (False, 0)] * 5
