"""The checked-in stubs in flamestream/wire/ must match proto/flamestream.proto, and the codec round-trips."""

from __future__ import annotations

import collections
import datetime
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flamestream.core import columns
from flamestream.core import payload as payloads
from flamestream.core.meta import GlobalTime
from flamestream.wire import codec, flamestream_pb2

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-Iflamestream/wire={ROOT / 'proto'}",
                    f"--python_out={tmp_path}", str(ROOT / "proto" / "flamestream.proto")], check=True, cwd=ROOT)
    spec = importlib.util.spec_from_file_location("fresh_pb2", tmp_path / "flamestream" / "wire" / "flamestream_pb2.py")
    assert spec is not None and spec.loader is not None
    source = (tmp_path / "flamestream" / "wire" / "flamestream_pb2.py").read_text()
    checked_in = (ROOT / "flamestream" / "wire" / "flamestream_pb2.py").read_text()
    marker = "AddSerializedFile(b"
    fresh_descriptor = source[source.index(marker):].split("\n", 1)[0]
    assert fresh_descriptor == checked_in[checked_in.index(marker):].split("\n", 1)[0], \
        "flamestream/wire is stale: run bash scripts/gen-proto"


def test_services_expose_the_contract() -> None:
    services = {s.name: [m.name for m in s.methods] for s in flamestream_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Front": ["Push"],
        "Worker": ["Exchange"],
        "Acker": ["Ack", "WatchMinTime"],
        "Barrier": ["Deliver", "Subscribe", "Commit", "Committed", "Stats"],
        "Node": ["Frames"],
    }


def test_batch_round_trip_keeps_types_and_acks() -> None:
    gt = GlobalTime(17, 1)
    entries = [(3, -5, (("a", 1), gt, (0, 1 << 32), False)), (2, None, ({"k": [1, 2]}, gt, (1,), True))]
    acks = codec.new_acks([gt, GlobalTime(18, 0)])
    msg = flamestream_pb2.ItemBatch.FromString(codec.encode_batch(entries, acks, sender=2, tick=5).SerializeToString())
    assert codec.decode_batch(msg) == (entries, acks)
    assert msg.sender == 2 and msg.tick == 5


def test_xor_into_combines_and_cancels() -> None:
    gt = GlobalTime(1, 0)
    total: dict[GlobalTime, int] = {}
    codec.xor_into(total, {gt: 0b1010})
    codec.xor_into(total, {gt: 0b0110})
    assert total == {gt: 0b1100}
    codec.xor_into(total, {gt: 0b1100})
    assert codec.ack_messages(total) == []  # a zero XOR carries no information


def test_payloads_are_json() -> None:
    assert payloads.decode_payload(payloads.encode_payload({"word": "мяч", "n": [1]})) == {"word": "мяч", "n": [1]}
    with pytest.raises(payloads.PayloadError, match="not valid JSON"):
        payloads.decode_payload(b"{oops")
    with pytest.raises(payloads.PayloadError):
        payloads.decode_payload(b"\xff")
    with pytest.raises(payloads.PayloadError):
        payloads.decode_payload(b"9" * 5000)  # beyond Python's int-from-string limit
    with pytest.raises(payloads.PayloadError):
        payloads.decode_payload(b"[" * 100_000 + b"]" * 100_000)  # nested too deep


def test_payloads_that_are_not_plain_json_are_encoded_as_before() -> None:
    """orjson writes plain JSON; the rest keeps ``json``'s rules (tuples as arrays, other types as their repr)."""
    point = collections.namedtuple("point", "x y")
    cases = {b'{"w":"\xd0\xbc","p":[1,2.5]}': {"w": "м", "p": (1, 2.5)}, b"[1,2]": point(1, 2),
             b'{"1":"x"}': {1: "x"}, b'"{3}"': {3}, str(2**70).encode(): 2**70, b"null": float("nan"),
             b'"datetime.date(2026, 11, 22)"': datetime.date(2026, 11, 22)}
    for encoded, payload in cases.items():
        assert payloads.encode_payload(payload) == encoded


def test_to_records_serializes_topic_records_and_drops_tombstone_payloads() -> None:
    gt = GlobalTime(7, 1)
    records = codec.to_records([({"a": 1}, gt, (0,), False), ({"a": 0}, gt, (1,), True)])
    assert records[1] == (None, gt, (1,), True)
    data, time, trace, tombstone = records[0]
    assert (time, trace, tombstone) == (gt, (0,), False)
    assert flamestream_pb2.Record.FromString(data) == flamestream_pb2.Record(
        time=flamestream_pb2.GlobalTime(ts=7, front=1), payload=b'{"a":1}')


@pytest.mark.parametrize("gt", [GlobalTime(0, 0), GlobalTime(1, 0), GlobalTime(0, 5), GlobalTime(1_764_000_000_000, 3),
                                GlobalTime(2**62, 2**31 - 1)])
@pytest.mark.parametrize("length", [0, 1, 123, 124, 125, 126, 16_381, 16_382, 2_097_149, 2_097_150])
def test_to_records_writes_the_bytes_protobuf_would(gt: GlobalTime, length: int) -> None:
    """The records are written by hand; a recovery matches re-released records against the topic's by their bytes,
    so they must be protobuf's own, byte for byte.  Payload lengths (a JSON string of ``length`` characters, two
    quotes more) straddle the one-, two- and three-byte varints."""
    payload = "x" * length
    (data, _gt, _trace, _tombstone), = codec.to_records([(payload, gt, (0,), False)])
    expected = flamestream_pb2.Record(time=flamestream_pb2.GlobalTime(ts=gt.ts, front=gt.front),
                                      payload=payloads.encode_payload(payload))
    assert data == expected.SerializeToString()


@settings(max_examples=300, deadline=None)
@given(partition=st.integers(0, 2**31 - 1),
       records=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**62), st.integers(0, 2**31 - 1),
                                  st.binary(max_size=300)), max_size=8))
@example(partition=0, records=[(0, 0, 0, b"")])  # every field at its default: protobuf leaves them all out
def test_record_batches_are_the_bytes_protobuf_would_write(partition: int,
                                                           records: list[tuple[int, int, int, bytes]]) -> None:
    """The barrier sends ``columns.record_batch``'s bytes as the ``RecordBatch`` messages of a subscription: they must
    be the ones protobuf writes for the same records, whatever the partition, the offsets (one to ten byte varints)
    and the stored records' sizes."""
    stored = [(offset, flamestream_pb2.Record(time=flamestream_pb2.GlobalTime(ts=ts, front=front),
                                              payload=data).SerializeToString())
              for offset, ts, front, data in records]
    expected = flamestream_pb2.RecordBatch(records=[
        flamestream_pb2.Record(partition=partition, offset=offset, time=flamestream_pb2.GlobalTime(ts=ts, front=front),
                               payload=data) for offset, ts, front, data in records])
    assert columns.record_batch(partition, stored) == expected.SerializeToString()


def _protobufs_fields(data: bytes) -> list[tuple[int, int, int, int, bytes]] | None:
    """What protobuf reads of a ``RecordBatch``, as ``columns.record_fields`` gives it; None if it refuses the bytes."""
    try:
        batch = flamestream_pb2.RecordBatch.FromString(data)
    except DecodeError:
        return None
    return [(m.partition, m.offset, m.time.ts, m.time.front, m.payload) for m in batch.records]


_record_st = st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1),
                       st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=200))


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_record_st, max_size=6), cut=st.integers(0, 2000), flip=st.integers(0, 2000),
       junk=st.binary(max_size=40))
@example(records=[(0, 0, 0, 0, b"")], cut=2000, flip=2000, junk=b"")
def test_record_fields_read_what_protobuf_reads_or_leave_the_bytes_to_it(
        records: list[tuple[int, int, int, int, bytes]], cut: int, flip: int, junk: bytes) -> None:
    """A consumer reads the form a barrier writes with ``columns.record_fields`` and anything else with protobuf: on
    any bytes — protobuf's own serialization of any records, cut short, a byte flipped, junk after — it gives what
    protobuf reads or None, never something else and never an error; and protobuf's serialization of records with
    no negative number is never left to protobuf."""
    data = flamestream_pb2.RecordBatch(records=[
        flamestream_pb2.Record(partition=p, offset=o, time=flamestream_pb2.GlobalTime(ts=ts, front=f), payload=b)
        for p, o, ts, f, b in records]).SerializeToString()
    fields = columns.record_fields(data)
    assert fields == _protobufs_fields(data) or fields is None
    if all(min(p, o, ts, f) >= 0 for p, o, ts, f, _b in records):
        assert fields == _protobufs_fields(data)
    flipped = bytes(b ^ 0x5A if i == flip % max(len(data), 1) else b for i, b in enumerate(data))
    for damaged in (data[:cut], flipped, data + junk, junk):
        read = columns.record_fields(damaged)
        assert read is None or read == _protobufs_fields(damaged)


@pytest.mark.parametrize("record", [
    b"\x1a\x05\x08\x01\x22\x01X",  # the time holds an unknown field 4, shaped like a payload, and the record none
    b"\x22\x01A\x0a\x00",  # after the payload, field 1 again with the wrong wire type: unknown to protobuf
    b"\x10\x01\x08\x02",  # the offset before the partition
    b"\x08\x01\x08\x02",  # the partition twice: protobuf keeps the last
    b"\x28\x07\x22\x01A",  # an unknown field first
])
def test_a_record_in_another_form_is_left_to_protobuf(record: bytes) -> None:
    """Valid ``RecordBatch`` bytes that no barrier writes — fields out of order, repeated or unknown — are protobuf's to
    read: ``record_fields`` gives None for them (where it gave anything, it would have to be protobuf's reading)."""
    data = b"\x0a" + columns.varint(len(record)) + record
    assert _protobufs_fields(data) is not None
    assert columns.record_fields(data) is None


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**31 - 1, 2**63 - 1, -1, -(2**31), -(2**63)])
def test_varints_are_protobufs(n: int) -> None:
    """Negative numbers as protobuf writes a negative int64: ten bytes of two's complement."""
    field = flamestream_pb2.Record(offset=n).SerializeToString() if n else b"\x10\x00"
    assert b"\x10" + columns.varint(n) == field
