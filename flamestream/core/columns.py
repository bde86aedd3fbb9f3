"""Item batches as columns and back: the per-item loops of the wire codec, compiled with the core.

Why in the core: these loops run for every item that crosses a process
boundary, twice (the sender flattens, the receiver checks and rebuilds), and
as interpreted C-level passes (``zip``, ``set(map(type, ...))``, ``sum``) the
checks alone cost more than unpickling the batch did.  mypyc turns each loop
into C that tests a type with one pointer comparison, so the checked codec
costs no more than unchecked pickle (``bench/codec.py``).  Pure: the framing
(``flamestream.wire.codec``) stays with the wire.  The other per-record loop
here writes a subscription's record batches (``record_batch``), for the same
reason: it runs for every record a barrier sends.

What a receiver must refuse, never raise on (an exception in a worker's
processing loop stops the node), is every value it indexes with, compares or
writes into a protobuf field: operation indexes, hashes, global times, traces,
tombstone flags and, for a barrier, records.  ``MalformedColumns`` names the
first bad one.  Payloads are any plain values and are not walked (see the
codec's docstring).
"""

from __future__ import annotations

from typing import Any, Final

from flamestream.core.hashing import INT32_MAX, INT32_MIN
from flamestream.core.meta import GlobalTime

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


_NO_TIME: Final = object()
"""What ``flatten`` compares an item's time with before the first: nothing an item holds (None would let an item
whose time is None pass unchecked as the previous item's time)."""


class MalformedColumns(ValueError):
    """Columns a sender could not have written: the message says which value is wrong."""


def flatten(entries: list[Any]) -> tuple[bool, list[Any], list[Any], list[Any], list[Any], list[int], list[Any],
                                          list[Any]] | None:
    """``entries`` — all envelopes (operation, hash, item) or all items (payload, global time, trace, tombstone),
    tuples or lists — as (are they envelopes, operations, hashes, payloads, times, time indexes, traces,
    tombstones), or None if they are neither.

    Everything a step made of one input shares that input's global time, so
    a batch holds few distinct ones: each is written once, as two ints in
    ``times``, and each item as an index into them.  Only what decoding
    rebuilds rather than reads back is checked here (the global times: an
    envelope or item given as a list comes back a tuple); every other value
    is passed on as it is, so a wrong one reaches the receiver's checks.
    """
    ops: list[Any] = []
    hashes: list[Any] = []
    items: list[Any] = entries
    envelopes = bool(entries) and _column(entries[0]) and len(entries[0]) == 3
    if envelopes:
        items = []
        for given in entries:
            envelope: tuple[Any, ...] = given if type(given) is tuple else _tuple(given)
            if len(envelope) != 3:
                return None
            ops.append(envelope[0])
            hashes.append(envelope[1])
            items.append(envelope[2])
    payloads: list[Any] = []
    traces: list[Any] = []
    tombstones: list[Any] = []
    time_of: list[int] = []
    times: list[Any] = []  # not list[int]: a GlobalTime of other values is written as it is, and refused on receipt
    position: dict[GlobalTime, int] = {}
    last: object = _NO_TIME
    index = 0
    for entry in items:
        item: tuple[Any, ...] = entry if type(entry) is tuple else _tuple(entry)  # typed: indexed without lookups
        if len(item) != 4:
            return None
        gt = item[1]
        if gt is not last:  # neighbours mostly share a time: one pointer comparison instead of a hash lookup
            if type(gt) is not GlobalTime:
                return None
            found = position.get(gt)
            if found is None:
                found = position[gt] = len(position)
                times.extend(gt)  # as they are: compiled, gt.ts would raise TypeError for a non-int
            index, last = found, gt
        payloads.append(item[0])
        time_of.append(index)
        traces.append(item[2])
        tombstones.append(item[3])
    return envelopes, ops, hashes, payloads, times, time_of, traces, tombstones


def envelopes_of(ops: Any, hashes: Any, payloads: Any, times: Any, time_of: Any, traces: Any,
                 tombstones: Any) -> list[Any]:
    """The envelopes ``flatten`` made columns of, every value a worker indexes with checked."""
    items = items_of(payloads, times, time_of, traces, tombstones, -1)
    op_column, hash_column = _list(ops), _list(hashes)
    if len(op_column) != len(items) or len(hash_column) != len(items):
        raise MalformedColumns("the columns of the batch differ in length")
    out: list[Any] = []
    for i in range(len(items)):
        op = op_column[i]
        if type(op) is not int or not 0 <= op <= INT32_MAX:
            raise MalformedColumns("an operation index is not an int in 0..2**31-1")
        h = hash_column[i]
        if h is not None and (type(h) is not int or not INT32_MIN <= h <= INT32_MAX):
            raise MalformedColumns("a hash is neither None nor an int32")
        out.append((op, h, items[i]))
    return out


def items_of(payloads: Any, times: Any, time_of: Any, traces: Any, tombstones: Any, record_bytes: int) -> list[Any]:
    """The items ``flatten`` made columns of, every value a receiver indexes with checked.

    ``record_bytes`` >= 0: the items are a barrier's — each payload a
    serialized record (bytes), or None for a tombstone — and their records
    add up to no more than that many bytes (the message's size: a crafted
    batch could otherwise reference one large record from every item, and the
    barrier would append it to the topic once per item).  Negative: payloads
    are any values.
    """
    payload_column, index_column, trace_column, tombstone_column = \
        _list(payloads), _list(time_of), _list(traces), _list(tombstones)
    if not len(payload_column) == len(index_column) == len(trace_column) == len(tombstone_column):
        raise MalformedColumns("the columns of the batch differ in length")
    gts = _global_times(_list(times))
    count = len(gts)
    records = record_bytes >= 0
    total = 0
    out: list[Any] = []
    for i in range(len(payload_column)):
        payload = payload_column[i]
        tombstone = tombstone_column[i]
        if type(tombstone) is not bool:
            raise MalformedColumns("a tombstone flag is not a bool")
        if records:
            if payload is None:
                if not tombstone:
                    raise MalformedColumns("an item has no record but is not a tombstone")
            elif type(payload) is not bytes:
                raise MalformedColumns("an item's payload is neither a serialized record (bytes) nor None "
                                       "(a tombstone)")
            elif tombstone:
                raise MalformedColumns("an item has a record but is a tombstone")
            else:
                total += len(payload)
        trace = trace_column[i]
        if type(trace) is not tuple:
            raise MalformedColumns("a trace is not a tuple of ints")
        marks: tuple[object, ...] = trace
        for mark in marks:
            if type(mark) is not int:
                raise MalformedColumns("a trace is not a tuple of ints")
        index = index_column[i]
        if type(index) is not int or not 0 <= index < count:
            raise MalformedColumns("an item refers to a global time the batch does not hold")
        out.append((payload, gts[index], trace, tombstone))
    if total > record_bytes >= 0:
        raise MalformedColumns("the items' records add up to more bytes than the message (records shared by "
                               "reference)")
    return out


_ONE_BYTE: Final = [bytes((n,)) for n in range(128)]


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint: seven bits a byte, low first, the high bit set on all but the last; a negative
    ``n`` as its 64-bit two's complement (ten bytes), as protobuf writes a negative int32 or int64."""
    if 0 <= n < 128:
        return _ONE_BYTE[n]
    if n < 0:
        n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n >= 128:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record_batch(partition: int, records: list[tuple[int, bytes]]) -> bytes:
    """A serialized ``RecordBatch`` of topic ``records`` — (offset, the stored ``Record`` bytes: time and payload)
    — of ``partition``: the bytes ``SerializeToString`` gives for the same message (``tests/test_wire.py``).

    Why by hand: a barrier sends every record it releases to every subscriber,
    and building the message — a ``Record`` added, the stored bytes merged
    into it, its partition and offset set, then the whole serialized — cost
    0.78 us a record, a twentieth of node0 on the inverted index.  Compiled,
    this loop writes each record's partition and offset fields, in field
    order before the stored ones (proto3 leaves a zero out), and frames it.
    """
    head = b"" if partition == 0 else b"\x08" + varint(partition)
    parts: list[bytes] = []
    for offset, data in records:
        fields = head + (b"\x10" + varint(offset) if offset else b"")
        parts.append(b"\x0a" + varint(len(fields) + len(data)))
        parts.append(fields)
        parts.append(data)
    return b"".join(parts)


def record_fields(data: bytes) -> list[tuple[int, int, int, int, bytes]] | None:
    """The records of the serialized ``RecordBatch`` ``data`` as (partition, offset, the time's timestamp, the
    time's front, payload) each, where ``data`` is in the form ``record_batch`` writes and protobuf serializes
    (each field at most once, in field order, zeros left out; timestamps, offsets, partitions and fronts not
    negative); None for any other bytes, which the reader then parses with protobuf, the authority on what
    else the same message may look like and on what is malformed.

    Why: a consumer reads every record, and reading each one's five fields back out of protobuf's message
    objects (a record object, a time object, an attribute each) cost more than the parse itself.  Compiled, this
    loop reads them straight from the bytes.  Hostile bytes are bounds-checked at every step: they give None.
    """
    out: list[tuple[int, int, int, int, bytes]] = []
    n = len(data)
    pos = 0
    while pos < n:
        start, end = _length_delimited(data, pos, n, 0x0A)  # field 1, records
        if start < 0 or start == pos:
            return None
        partition, pos = _varint_field(data, start, end, 0x08, INT32_MAX)
        offset, pos = _varint_field(data, pos, end, 0x10, INT64_MAX)
        at, stop = _length_delimited(data, pos, end, 0x1A)  # the time
        ts, pos = _varint_field(data, at, stop, 0x08, INT64_MAX)
        front, pos = _varint_field(data, pos, stop, 0x10, INT32_MAX)
        if pos != stop:
            return None
        at, pos = _length_delimited(data, stop, end, 0x22)  # the payload
        if pos != end:
            return None
        out.append((partition, offset, ts, front, data[at:pos]))
    return out


def _varint_field(data: bytes, pos: int, end: int, tag: int, limit: int) -> tuple[int, int]:
    """The varint field whose key is ``tag`` if it starts at ``pos``: (its value, where it ends); (0, ``pos``) if
    something else or ``end`` comes first; (0, -1) if it does not end before ``end``, or exceeds ``limit``, or
    ``pos`` is -1 already (so that a failure carries through the reads after it)."""
    if pos < 0 or pos >= end or data[pos] != tag:
        return 0, pos
    value, pos = _varint_at(data, pos + 1, end)
    return (value, pos) if pos >= 0 and value <= limit else (0, -1)


def _length_delimited(data: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    """Where the contents of the length-delimited field ``tag`` at ``pos`` start and end; (``pos``, ``pos``) if
    something else or ``end`` comes first (an absent field is empty); (-1, -1) if it overruns ``end`` or ``pos`` is
    -1 already."""
    size, at = _varint_field(data, pos, end, tag, end)
    if at == pos:
        return pos, pos
    if at < 0 or at + size > end:
        return -1, -1
    return at, at + size


def _varint_at(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and where it ends, if it ends before ``end`` in at most ten bytes and below 2**64;
    (0, -1) otherwise."""
    value = 0
    shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value, pos) if value < 1 << 64 else (0, -1)
        shift += 7
    return 0, -1


def _global_times(times: list[Any]) -> list[GlobalTime]:
    if len(times) % 2:
        raise MalformedColumns("global times must be pairs of ints")
    out: list[GlobalTime] = []
    for i in range(0, len(times), 2):
        ts = times[i]
        front = times[i + 1]
        if type(ts) is not int or type(front) is not int:
            raise MalformedColumns("global times must be pairs of ints")
        if not INT64_MIN <= ts <= INT64_MAX or not 0 <= front <= INT32_MAX:
            raise MalformedColumns("a global time is out of range (timestamp: int64, front: 0..2**31-1)")
        out.append(GlobalTime(ts, front))
    return out


def _column(value: Any) -> bool:
    return type(value) is tuple or type(value) is list


def _tuple(entry: Any) -> tuple[Any, ...]:
    """An entry given as a list, as a tuple; anything else that is no tuple, as an empty (misshapen) one."""
    return tuple(entry) if type(entry) is list else ()


def _list(column: Any) -> list[Any]:
    """A decoded column as a list, which compiled code indexes without a generic lookup (``flatten`` writes lists;
    tuples are taken too); ``MalformedColumns`` for anything else."""
    if type(column) is list:
        return column
    if type(column) is tuple:
        return list(column)
    raise MalformedColumns("a column of the batch is neither a list nor a tuple")
