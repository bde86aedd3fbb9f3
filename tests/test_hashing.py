"""stable_hash: equal payloads hash equally, in every process, whatever their dict or set order."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flamestream.core import hashing
from flamestream.core.hashing import INT32_MAX, INT32_MIN, STR_HASHED_LENGTH, STR_HASHES, stable_hash, to_int32

ROOT = Path(__file__).resolve().parents[1]

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary())
hashables = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=5),
                         max_leaves=12)
"""Values that can be set elements and dict keys (NaN left out: it equals nothing, not even itself)."""
payloads = st.recursive(hashables, lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                                                  | st.dictionaries(hashables, inner, max_size=5)
                                                  | st.sets(hashables, max_size=5)), max_leaves=25)
"""JSON-like values with tuples, sets and frozensets, nested."""


def twin(value: Any, rng: random.Random, hashable: bool = False) -> Any:
    """An equal value built differently: dicts and sets filled in another order, numbers of another equal type.

    ``hashable``: the value is a dict key or set element, so its sets must stay frozensets.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str | bytes):
        return value
    if isinstance(value, int):
        if value in (0, 1) and rng.random() < 0.5:
            return bool(value)
        return float(value) if abs(value) < 2**53 and rng.random() < 0.5 else value
    if isinstance(value, float):
        return int(value) if value.is_integer() and rng.random() < 0.5 else value
    if isinstance(value, list):
        return [twin(item, rng) for item in value]
    if isinstance(value, tuple):
        return tuple(twin(item, rng, hashable) for item in value)
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {twin(key, rng, hashable=True): twin(item, rng) for key, item in items}
    elements = list(value)
    rng.shuffle(elements)
    rebuilt = [twin(element, rng, hashable=True) for element in elements]
    # a set equals the frozenset of the same elements
    return frozenset(rebuilt) if hashable or rng.random() < 0.5 else set(rebuilt)


@given(payloads, st.randoms(use_true_random=False))
@example({"b": 1, "a": {"y": [1.0], "x": True}}, random.Random(0))
def test_equal_payloads_hash_equally(value: Any, rng: random.Random) -> None:
    other = twin(value, rng)
    assert other == value
    assert stable_hash(other) == stable_hash(value)


class Pair(NamedTuple):
    left: str
    right: int


def test_numbers_equal_across_types_hash_equally() -> None:
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash(0) == stable_hash(0.0) == stable_hash(-0.0) == stable_hash(False)
    assert stable_hash([1, {2: {3}}]) == stable_hash([True, {2.0: frozenset({3.0})}])
    assert stable_hash({"b": 1, "a": 2}) == stable_hash(OrderedDict(a=2, b=1))
    assert stable_hash(Pair("a", 1)) == stable_hash(("a", 1))
    assert stable_hash(bytearray(b"ab")) == stable_hash(b"ab")


def test_unequal_payloads_are_told_apart() -> None:
    """Not a constant: order of a sequence, values under a key and the container kind all count."""
    distinct = [[1, 2], [2, 1], (1, 2), {1: 2}, {2: 1}, {1, 2}, {"a": 1}, {"a": 2}, ["a"], [b"a"], [None], [0.5],
                [], (), {}, set()]
    assert len({stable_hash(value) for value in distinct}) == len(distinct)


@dataclass
class Point:
    x: int
    tags: dict[str, int]


class Plain:
    def __init__(self, x: int) -> None:
        self.x = x


def test_unknown_types_hash_by_type_and_attributes_not_by_address() -> None:
    assert stable_hash(Point(1, {"a": 1, "b": 2})) == stable_hash(Point(1, {"b": 2, "a": 1}))
    assert stable_hash(Point(1, {})) != stable_hash(Point(2, {}))
    assert stable_hash(Plain(1)) == stable_hash(Plain(1))  # two objects, two addresses, one default repr each
    assert stable_hash(Plain(1)) != stable_hash(Plain(2))


def hashes_in_a_process(values: list[Any], seed: str) -> list[int]:
    """stable_hash of each value in a fresh interpreter whose str hash seed (and so set order) is ``seed``."""
    code = ("import json, pickle, sys\nfrom flamestream.core.hashing import stable_hash\n"
            "print(json.dumps([stable_hash(v) for v in pickle.load(sys.stdin.buffer)]))")
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(values), capture_output=True, cwd=ROOT,
                          env={**os.environ, "PYTHONHASHSEED": seed}, check=True, timeout=60)
    result: list[int] = json.loads(done.stdout)
    return result


@settings(max_examples=10, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=10))
@example([{f"word{i}" for i in range(20)}, frozenset({"a", "b", "c", ("d", "e")}), {"k": {"x", "y", "z"}}])
def test_hashes_do_not_depend_on_the_hash_seed_of_the_process(values: list[Any]) -> None:
    here = [stable_hash(value) for value in values]
    assert hashes_in_a_process(values, "1") == here
    assert hashes_in_a_process(values, "2") == here


@given(st.text())
def test_a_str_hashes_as_the_crc32_of_its_utf8(text: str) -> None:
    """As it always has: layouts already deployed keep routing words where they did."""
    assert stable_hash(text) == to_int32(zlib.crc32(text.encode()))


def test_remembered_str_hashes_stay_their_crc32_past_the_bound_of_what_is_remembered() -> None:
    """``stable_hash`` remembers short strings it hashed (up to ``STR_HASHES``, then it forgets them all; none
    longer than ``STR_HASHED_LENGTH``): asked again, before and after it forgot, a string still hashes as its
    CRC-32; a string that cannot be encoded fails every time, never remembered."""
    words = [f"w{i}-\u0436" for i in range(STR_HASHES + 10)] + ["x" * n for n in range(STR_HASHED_LENGTH - 2, 200)]
    first = [stable_hash(word) for word in words]
    again = [stable_hash(word) for word in reversed(words)][::-1]
    assert first == again == [to_int32(zlib.crc32(word.encode())) for word in words]
    longest, longer = "y" * STR_HASHED_LENGTH, "y" * (STR_HASHED_LENGTH + 1)
    assert stable_hash(longest) == to_int32(zlib.crc32(longest.encode()))
    assert stable_hash(longer) == to_int32(zlib.crc32(longer.encode()))
    # What it holds stays bounded: so many strings, none long.
    assert longest in hashing._str_hashes and longer not in hashing._str_hashes
    assert len(hashing._str_hashes) <= STR_HASHES
    for _ in range(2):
        with pytest.raises(UnicodeEncodeError):
            stable_hash("\ud800")


@given(payloads)
def test_hashes_are_int32(value: Any) -> None:
    assert INT32_MIN <= stable_hash(value) <= INT32_MAX
