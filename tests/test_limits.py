"""Bounded resources (issue #12 part 4), without a cluster: the per-item output cap and the name/sequence limits.

The output cap is part of the graph, so the oracle, the local runtime (any workers, fronts, delivery order) and
a worker core cut exactly the same items: each becomes its dead letter.  The cluster side is
``test_limits_cluster.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flamestream import Graph, LocalRuntime, run_oracle
from flamestream.client import ANONYMOUS, AsyncClient, Record, _check_group
from flamestream.core.dead_letter import is_dead_letter
from flamestream.core.front import stamp_inputs
from flamestream.core.graph import GraphError
from flamestream.core.hashing import stable_hash
from flamestream.core.limits import (
    MAX_NAME_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_OUTPUTS,
    MAX_SEQUENCE,
    OutputLimitError,
    bounded_outputs,
    estimated_size,
    group_fault,
    over_memory_budget,
    producer_fault,
    sequence_fault,
)
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import compile_graph


def split(line: str) -> list[str]:
    return line.split()


def endless(line: str) -> Iterator[str]:
    return itertools.repeat(line)


def copies(line: str) -> list[str]:
    """Few outputs, but each the whole (large) line: caught by the bytes estimate, not the count."""
    return [line] * 4


def word_of(p: Any) -> str:
    return p if isinstance(p, str) else str(p["word"])


def word_hash(p: Any) -> int:
    return stable_hash(word_of(p))


def combine(window: tuple[Any, ...]) -> list[Any]:
    if len(window) == 1:
        return [{"word": window[0], "count": 1}] if isinstance(window[0], str) else []
    acc, word = window
    return [{"word": word, "count": acc["count"] + 1}] if isinstance(acc, dict) and isinstance(word, str) else []


def wordcount(max_outputs: int = MAX_OUTPUTS, max_output_bytes: int = MAX_OUTPUT_BYTES, fn: Any = split) -> Graph:
    g = Graph("wordcount", max_outputs=max_outputs, max_output_bytes=max_output_bytes)
    loop = g.merge(2)
    g.source().to(g.map(fn, name="split")).to(loop.inp(0))
    fanout = loop.to(g.grouping(2, balance=word_hash, equivalence=word_of)).to(g.map(combine)).to(g.broadcast(2))
    g.connect(fanout.out(0), g.sink())
    g.connect(fanout.out(1), loop.inp(1))
    return g


def multiset(pairs: list[tuple[Any, Any]]) -> Counter[tuple[Any, str]]:
    return Counter((gt, repr(p)) for gt, p in pairs)


# -- the output cap ----------------------------------------------------------------------------------------

def test_bounded_outputs_passes_up_to_the_cap_and_fails_beyond() -> None:
    assert bounded_outputs(iter(range(3)), 3, 1000) == [0, 1, 2]
    with pytest.raises(OutputLimitError, match="more than 3 outputs"):
        bounded_outputs(iter(range(4)), 3, 1000)
    with pytest.raises(OutputLimitError, match="more than 5 outputs"):
        bounded_outputs(itertools.repeat("x"), 5, 1000)  # an endless generator is read one past the cap only
    with pytest.raises(OutputLimitError, match="estimated 10 bytes"):
        bounded_outputs(["x" * 6, "y" * 5], 5, 10)
    assert bounded_outputs(["x" * 5, "y" * 5], 5, 10) == ["x" * 5, "y" * 5]
    # One output cannot amplify, whatever its size: a reduce's accumulator grows with the stream, legitimately.
    assert bounded_outputs(["x" * 11], 5, 10) == ["x" * 11]


def test_estimated_size_is_cheap_on_huge_repeats_and_cycles() -> None:
    big = "x" * 1_000_000
    assert estimated_size([big] * 1_000_000, 5_000_000) > 5_000_000  # stops at the budget, not 10**12 bytes
    cycle: list[Any] = []
    cycle.append(cycle)
    assert estimated_size(cycle, 1000) > 1000
    assert estimated_size({"word": "dog", "count": 1}, 10**6) == estimated_size({"count": 1, "word": "dog"}, 10**6)


class _Text(str):
    """A str subclass: not counted in place by type, so it must reach the same figure the long way."""


def _documented_size(value: Any) -> int:
    """``estimated_size``'s rule, stated recursively and walked whole: the figure it must match below budget."""
    if isinstance(value, str | bytes | bytearray):
        return len(value) + 2
    if isinstance(value, dict):
        return 2 + 2 * len(value) + sum(map(_documented_size, [*value.keys(), *value.values()]))
    if isinstance(value, list | tuple | set | frozenset):
        return 2 + 2 * len(value) + sum(map(_documented_size, value))
    return 8


_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                     st.binary(max_size=8), st.text(max_size=8).map(_Text), st.integers().map(float))
_plain = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.lists(inner, max_size=6).map(tuple), st.frozensets(st.integers(), max_size=4),
    st.dictionaries(st.text(max_size=4), inner, max_size=4)), max_leaves=40)


@given(_plain, st.integers(min_value=0, max_value=400))
def test_estimated_size_is_its_documented_rule_and_crosses_the_budget_where_it_does(value: Any, budget: int) -> None:
    # Numbers and strings inside tuples and lists are counted in place, the rest on the stack: the same figure.
    whole = _documented_size(value)
    assert estimated_size(value, 10**9) == whole
    # A budget is crossed exactly when the whole figure is above it (the walk may stop anywhere past it).
    assert (estimated_size(value, budget) > budget) == (whole > budget)


def lines() -> list[str]:
    return ["a dog", "the dog " * 10, "a cat", "x " * 7, "dog dog", "b"]


@pytest.mark.parametrize(("workers", "fronts", "seed", "adversarial"),
                         [(1, 1, 0, False), (3, 2, 1, True), (4, 1, 7, True), (2, 3, 3, False)])
def test_local_runtime_cuts_the_same_items_as_the_oracle(workers: int, fronts: int, seed: int,
                                                         adversarial: bool) -> None:
    graph = wordcount(max_outputs=6)
    expected, rejected = run_oracle(graph, stamp_inputs(lines(), fronts, 1))
    dead = [p["dead_letter"] for _, p in expected if is_dead_letter(p)]
    assert [(d["operation"], d["payload"]) for d in dead] == [("split", repr("the dog " * 10)),
                                                              ("split", repr("x " * 7))]
    assert all("more than 6 outputs" in d["error"] and "OutputLimitError" in d["error"] for d in dead)
    counts = sorted((p["word"], p["count"]) for _, p in expected if not is_dead_letter(p))
    assert counts == [("a", 1), ("a", 2), ("b", 1), ("cat", 1), ("dog", 1), ("dog", 2), ("dog", 3)]
    result = LocalRuntime(graph, workers=workers, fronts=fronts, seed=seed, adversarial=adversarial,
                          batch=3).run(lines())
    assert multiset([(gt, p) for gt, _trace, p in result.output]) == multiset(expected)
    assert result.rejected == rejected == []


def test_endless_and_oversized_maps_are_dead_letters_everywhere() -> None:
    for graph, error in ((wordcount(fn=endless), "more than 10000 outputs"),
                         (wordcount(max_output_bytes=1000, fn=copies), "estimated 1000 bytes")):
        inputs = ["short", "y" * 400]
        expected, _ = run_oracle(graph, stamp_inputs(inputs, 1, 1))
        dead = [p["dead_letter"] for _, p in expected if is_dead_letter(p)]
        assert len(dead) == (2 if error.startswith("more") else 1) and all(error in d["error"] for d in dead)
        result = LocalRuntime(graph, workers=2, seed=5, adversarial=True).run(inputs)
        assert multiset([(gt, p) for gt, _t, p in result.output]) == multiset(expected)


def test_the_cap_travels_with_the_graph() -> None:
    plain = wordcount().to_dict()
    assert "max_outputs" not in plain and "max_output_bytes" not in plain  # defaults serialise as before
    capped = wordcount(max_outputs=7, max_output_bytes=99)
    again = Graph.from_json(capped.to_json())
    assert (again.max_outputs, again.max_output_bytes) == (7, 99)
    plan = compile_graph(again)
    assert (plan.max_outputs, plan.max_output_bytes) == (7, 99)
    assert (compile_graph(Graph.from_dict(plain)).max_outputs) == MAX_OUTPUTS
    for bad in (0, -1, "5", 2.5):
        with pytest.raises(GraphError, match="max_outputs must be an integer >= 1"):
            wordcount(max_outputs=bad).validate()  # type: ignore[arg-type]
        with pytest.raises(GraphError, match="max_output_bytes must be an integer >= 1"):
            Graph.from_dict({**plain, "max_output_bytes": bad})


# -- names and sequences -----------------------------------------------------------------------------------

def test_producer_ids() -> None:
    assert producer_fault("orders") is None
    assert producer_fault("p" * MAX_NAME_BYTES) is None
    assert producer_fault("p" * (MAX_NAME_BYTES + 1)) == f"producer id longer than {MAX_NAME_BYTES} bytes"
    assert producer_fault("é" * 129) is not None  # bytes, not characters
    own = f"{ANONYMOUS}{uuid.uuid4().hex}-3"  # exactly what the SDK sends for anonymous pushes
    assert producer_fault(own) is None
    for reserved in ("~mine", "~anon-", "~anon-abc-0", f"{ANONYMOUS}{uuid.uuid4().hex}-0x"):
        assert "reserved" in (producer_fault(reserved) or "")


def test_sequences() -> None:
    assert sequence_fault(0) is None and sequence_fault(MAX_SEQUENCE) is None
    for bad in (MAX_SEQUENCE + 1, 2**64 - 1, -1):
        assert "above the largest allowed" in (sequence_fault(bad) or "")


def test_group_names() -> None:
    for good in ("readers", "a.b-c_d:e@f+g=h", "g" * MAX_NAME_BYTES):
        assert group_fault(good) is None
    assert "longer than 256" in (group_fault("g" * 2_000_000) or "")
    for bad in ("", ".", "..", "a/b", "tab\there", "spa ce", "\ud800", "ü"):
        assert group_fault(bad) is not None, bad


def test_sdk_refuses_bad_names_before_any_request() -> None:

    with pytest.raises(ValueError, match="longer than 256"):
        _check_group("g" * 300)
    client = AsyncClient("127.0.0.1:1", "default")  # never connects: the checks come first

    async def attempts() -> None:
        with pytest.raises(ValueError, match="at most 256 bytes"):
            await client.push(["x"], producer="p" * 257)
        with pytest.raises(ValueError, match="not starting"):
            await client.push(["x"], producer="~anon-mine")
        with pytest.raises(ValueError, match="may only hold"):
            await client.committed("a b", 0)
        with pytest.raises(ValueError, match="may only hold"):
            await client.commit(Record(partition=0, offset=0, time=GlobalTime(0, 0), payload=None), group="a/b")
        await client.close()

    asyncio.run(attempts())


def test_memory_budget_has_a_gap_between_going_over_and_coming_back() -> None:
    budget = 1000
    assert not over_memory_budget(1000, budget, was_over=False)  # at the budget is within it
    assert over_memory_budget(1001, budget, was_over=False)
    assert over_memory_budget(950, budget, was_over=True)  # stays over until below 90%
    assert over_memory_budget(900, budget, was_over=True)
    assert not over_memory_budget(899, budget, was_over=True)
    assert not over_memory_budget(950, budget, was_over=False)
    assert not over_memory_budget(10**12, 0, was_over=True)  # no budget
