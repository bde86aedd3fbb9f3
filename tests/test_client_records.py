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


def test_both_readers_of_a_record_batch_give_the_same_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer reads a barrier's batches with the compiled reader where the core runs compiled and with protobuf
    where it does not (``client._COMPILED``): the records must be the same either way."""
    from flamestream import client
    from flamestream.core import columns
    from flamestream.wire import flamestream_pb2 as pb

    stored = [(offset, pb.Record(time=pb.GlobalTime(ts=ts, front=front), payload=payload).SerializeToString())
              for offset, ts, front, payload in [(0, 0, 0, b'"first"'), (7, 1_764_000_000_000, 3, b'{"word": "x"}'),
                                                 (8, 1_764_000_000_000, 3, b"[1, 2.5, null]"),
                                                 (2**40, 2**62, 2**31 - 1, b"12345678901234567890123")]]
    data = columns.record_batch(5, stored)
    read: dict[bool, list[Record]] = {}
    for compiled in (True, False):
        monkeypatch.setattr(client, "_COMPILED", compiled)
        read[compiled] = []
        client._read_records(data, 5, "g", read[compiled])
    assert read[True] == read[False] and len(read[True]) == 4
    assert read[True][3].payload == 12345678901234567890123 and read[True][3].time == GlobalTime(2**62, 2**31 - 1)
