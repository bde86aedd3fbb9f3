"""The local runtime (replay, acker, barrier, tombstones) must release exactly the oracle's output.

Random graphs — cycles, diamonds, 2–3 chained groupings — random inputs, and
seeded delivery orders, compared as multisets of (global time, payload):
nothing lost, nothing twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flamestream import LocalRuntime, run_oracle
from flamestream.core.front import stamp_inputs
from tests.randomgraph import BALANCES, MAPS, Stage, build


def multiset(pairs: list[tuple[Any, Any]]) -> Counter[tuple[Any, str]]:
    return Counter((gt, repr(p)) for gt, p in pairs)


def check(stages: list[Stage], inputs: list[int], workers: int, fronts: int, per_ms: int, seed: int,
          adversarial: bool, batch: int) -> None:
    graph = build(stages)
    expected, rejected = run_oracle(graph, stamp_inputs(inputs, fronts, per_ms))
    result = LocalRuntime(graph, workers=workers, fronts=fronts, per_ms=per_ms, seed=seed,
                          adversarial=adversarial, batch=batch).run(inputs)
    got = [(gt, p) for gt, _trace, p in result.output]
    assert multiset(got) == multiset(expected)
    assert result.rejected == rejected == []
    released_order = [(gt, trace) for gt, trace, _ in result.output]
    assert released_order == sorted(released_order), "barrier must release in meta order"


stage_st = st.one_of(
    st.builds(Stage, kind=st.just("map"), fn=st.sampled_from(sorted(MAPS)), balance=st.sampled_from(sorted(BALANCES))),
    st.builds(Stage, kind=st.just("grouping"), window=st.integers(1, 3),
              balance=st.sampled_from(["mod2", "mod3", "mod5", "ident"])),
    st.builds(Stage, kind=st.just("diamond"), fn=st.sampled_from(sorted(MAPS)), other=st.sampled_from(sorted(MAPS)),
              balance=st.sampled_from(sorted(BALANCES))),
    st.builds(Stage, kind=st.just("reduce"), balance=st.sampled_from(sorted(BALANCES))),
    st.builds(Stage, kind=st.just("halving"), balance=st.sampled_from(sorted(BALANCES))),
)
run_st = {
    "inputs": st.lists(st.integers(0, 60), min_size=1, max_size=25),
    "workers": st.integers(1, 4),
    "fronts": st.integers(1, 3),
    "per_ms": st.integers(1, 3),
    "seed": st.integers(0, 2**32),
    "adversarial": st.booleans(),
    "batch": st.integers(1, 8),
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stages=st.lists(stage_st, min_size=1, max_size=5), **run_st)
def test_random_graphs_match_oracle(stages: list[Stage], **run: Any) -> None:
    check(stages, **run)


grouping_st = st.builds(Stage, kind=st.just("grouping"), window=st.integers(1, 3),
                        balance=st.sampled_from(["mod2", "mod3", "mod5", "ident"]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groupings=st.lists(st.one_of(grouping_st, st.builds(Stage, kind=st.just("reduce"))), min_size=2, max_size=3),
       between=st.lists(stage_st, max_size=2), **run_st)
def test_chained_groupings_match_oracle(groupings: list[Stage], between: list[Stage], **run: Any) -> None:
    """FlameStream issue #76: a stale tuple of grouping 1 hashing elsewhere must not pollute grouping 2."""
    stages = [groupings[0], *between, *groupings[1:]]
    check(stages, **{**run, "workers": max(run["workers"], 2), "adversarial": True})
