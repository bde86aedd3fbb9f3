"""``flamestream.core.splice``: an encoding that copies the unchanged parts of a value from its previous one."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flamestream.core import splice, values
from tests.test_snapshots import same, value_st


def spliced(value: Any, previous: splice.Spliced | None = None) -> splice.Spliced | None:
    parts, old = (previous[1], previous[0]) if previous is not None else (splice.NO_PARTS, b"")
    return splice.encode_spliced([(value, parts, old)])[0]


def with_one_replaced(value: Any, at: int, new: Any) -> Any:
    """``value``'s elements, the same objects, but the one at ``at`` (mod its length) replaced by ``new``."""
    elements = list(value)
    elements[at % len(elements)] = new
    return tuple(elements) if type(value) is tuple else elements


@settings(max_examples=300, deadline=None)
@given(first=st.lists(value_st, min_size=1, max_size=5), at=st.integers(0, 4), new=value_st,
       as_tuple=st.booleans())
def test_a_value_spliced_from_the_one_before_decodes_as_itself(first: list[Any], at: int, new: Any,
                                                               as_tuple: bool) -> None:
    """Whatever two plain values (the second the first with one element replaced, its other parts the same
    objects), each decodes exactly as itself; what could not be spliced is None, never wrong bytes."""
    before = tuple(first) if as_tuple else first
    after = with_one_replaced(before, at, new)
    one = spliced(before)
    if values.fragments([before])[0] is not None:  # a value one frame holds without the memo splices
        assert one is not None
    if one is not None:
        assert same(values.decode(one[0]), before)
    two = spliced(after, one)
    if two is not None:
        assert same(values.decode(two[0]), after)
        assert two[2] <= len(two[0])


def test_the_unchanged_parts_are_copied_and_the_changed_one_encoded() -> None:
    """An index word's shape: 64 shard dicts in a payload tuple, one of them replaced by the next posting."""
    shards = tuple({f"page{i}-{j}": bytes([i, j]) * 4 for j in range(5)} for i in range(64))
    first = [[1, 0, [3, 7], ("index", "word", shards, ("posting", "word", "page1", b"\x01"), 320)]]
    one = spliced(first)
    assert one is not None
    changed = dict(shards[9], page9=b"\x09")
    second = [[2, 0, [3, 8], ("index", "word", with_one_replaced(shards, 9, changed),
                              ("posting", "word", "page9", b"\x09"), 321)]]
    two = spliced(second, one)
    assert two is not None
    assert same(values.decode(two[0]), second)
    unchanged = sum(len(values.fragments([shard])[0] or b"") for shard in shards) - len(
        values.fragments([shards[9]])[0] or b"")
    assert two[2] == unchanged
    assert spliced(second, two) is not None and spliced(second, two)[0] == two[0]  # type: ignore[index]


def test_a_part_whose_length_changed_is_encoded_again() -> None:
    """Business logic must not mutate a payload; if one does, a part whose length changed is not copied stale."""
    part = {"a": 1}
    first = [("x", part)]
    one = spliced(first)
    part["b"] = 2
    two = spliced(first, one)
    assert two is not None and two[2] == 0
    assert values.decode(two[0]) == [("x", {"a": 1, "b": 2})]


def test_what_cannot_be_spliced_is_none() -> None:
    """A part larger than a frame, and a part that is not plain, leave the value to ``values.encode``."""
    assert spliced([("big", {"text": "x" * 70_000})]) is None
    assert spliced([("odd", {"value": object()})]) is None


def test_sets_and_long_sequences_are_parts_and_never_opened() -> None:
    long = list(range(splice.WIDTH + 1))
    value = [(frozenset({1, 2}), {3}, long, (1, (2, (3, (4, (5,))))))]
    one = spliced(value)
    assert one is not None
    assert one[1][0][:3] == [frozenset({1, 2}), {3}, long]
    assert same(values.decode(one[0]), value)
