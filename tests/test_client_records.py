"""The records a consumer reads are built without ``Record.__init__`` (``client._record``, for speed): they must be
the same frozen ``Record`` the constructor makes, field for field."""

from __future__ import annotations

import dataclasses

import pytest

from flamestream.client import Record, _record
from flamestream.core.meta import GlobalTime


def test_a_consumed_record_is_the_record_the_constructor_makes() -> None:
    made = Record(partition=3, offset=41, time=GlobalTime(1_764_000_000_000, 3), payload={"word": "x"}, group="g")
    consumed = _record(3, 41, GlobalTime(1_764_000_000_000, 3), {"word": "x"}, "g")
    assert type(consumed) is Record
    assert consumed == made and repr(consumed) == repr(made) and hash(consumed.time) == hash(made.time)
    # Every field set, and nothing else: a field added to Record must be added to _record too.
    assert vars(consumed) == vars(made)
    assert set(vars(consumed)) == {field.name for field in dataclasses.fields(Record)}
    assert dataclasses.replace(consumed, offset=42).offset == 42 and dataclasses.asdict(consumed)["group"] == "g"
    with pytest.raises(dataclasses.FrozenInstanceError):
        consumed.offset = 0  # type: ignore[misc]
