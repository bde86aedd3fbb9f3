"""A safe, exact and fast encoding of payload values: what grouping state is made of, as bytes.

Grouping state holds whatever business logic produced: tuples (every window
is one), dicts with non-string keys, sets, integers beyond 64 bits, NaN.
JSON loses most of that (a tuple comes back a list, and equal payloads must
stay equal or a restored state would group differently), and a JSON tagging
walk in Python costs seconds per snapshot of an inverted index (3.3 s for
20k keys, 8.8 MB).  So values are pickled — C speed, exact types — but only
*plain* values: the pickler refuses any object that is not None, a bool,
int, float, str, bytes, bytearray, list, tuple, dict, set or frozenset (a
user's class, a namedtuple), and the unpickler resolves no global at all.
Every opcode that could call code (REDUCE, BUILD, INST, OBJ, NEWOBJ) needs a
callable that only a global lookup provides, so decoding can build plain
values and nothing else: bytes read back from disk never run code.

Plain is exactly what the unpickler can build without a global — which is
why bytearray is one (pickle has an opcode for it): whatever a crafted
batch decodes to, business logic could have produced too, and it is
encoded, routed and snapshotted the same way.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

_PLAIN = (type(None), bool, int, float, str, bytes, bytearray, list, tuple, dict, set, frozenset)


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Called for every object the C pickler has no built-in fast path for; exact plain types never get here,
        # so whatever does is a type decoding could only rebuild through a global: refused.
        if type(obj) in _PLAIN:
            return NotImplemented
        raise ValueError(f"a value of type {type(obj).__qualname__} cannot be encoded (only None, bool, int, "
                         "float, str, bytes, bytearray, list, tuple, dict, set and frozenset can)")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain values are decoded")


FAST_LIMIT = 32 * 1024 * 1024
"""Bytes a value may take without the memo before it is encoded again with it (see ``encode_each``)."""


class _Spilled(Exception):
    """A value written without the memo grew past ``FAST_LIMIT``."""


class _Capped(io.BytesIO):
    """Pickler output that refuses to grow past ``FAST_LIMIT``.  The C pickler writes whole frames (64 KB), so the
    check costs nothing per object."""

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > FAST_LIMIT:
            raise _Spilled
        return super().write(data)


def _fast(out: io.BytesIO) -> _PlainPickler:
    pickler = _PlainPickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    return pickler


def encode(value: Any) -> bytes:
    """``value`` as bytes that ``decode`` turns back into an equal value of the same types; ValueError if it is
    not a plain value."""
    return next(encode_each((value,)))


def encode_each(values: Iterable[Any]) -> Iterator[bytes]:
    """``encode`` of each value in turn, through one pickler: a snapshot encodes thousands of small buckets
    each second, and a pickler per value would cost more than most of them.

    Without the memo (pickle's "fast" mode): a snapshot of an inverted index
    is mostly small tuples and strings, and recording each in the memo took
    three quarters of the encoding (0.41 s against 0.09 s for a worker's 19 MB
    of posting lists).  What the memo is still needed for: a value whose parts
    are shared (``a = [a, a]`` forty times over) is written once per path
    without it — exponentially many bytes — and a cyclic one not at all.  So a
    value that spills past ``FAST_LIMIT`` or is cyclic is written again with
    the memo; what is not plain fails both ways, and that error is raised.
    Decoding is the same either way.
    """
    out = _Capped()
    pickler = _fast(out)
    for value in values:
        encoded = _without_memo(pickler, out, value)
        if encoded is None:
            pickler = _fast(out)  # its state after an interrupted dump is not known
            encoded = _with_memo(value)
        yield encoded


def _without_memo(pickler: _PlainPickler, out: _Capped, value: Any) -> bytes | None:
    """``value`` written by the fast ``pickler`` into ``out``, or None if it spilled, is cyclic or not plain."""
    out.seek(0)
    out.truncate()
    try:
        pickler.dump(value)
    except (_Spilled, pickle.PicklingError, RecursionError, ValueError):  # ValueError: a cycle, or not plain
        return None
    return out.getvalue()


def _with_memo(value: Any) -> bytes:
    out = io.BytesIO()
    try:
        _PlainPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except (pickle.PicklingError, RecursionError) as exc:
        raise ValueError(f"cannot encode the value: {exc}") from exc
    return out.getvalue()


REUSE_DEPTH = 8
"""How deep ``PartWriter`` goes into lists and tuples before it takes what it meets whole: a snapshot's bucket
puts a payload five levels down (grouping, buckets, bucket, entries, entry), so three levels into it."""

Parts = dict[int, tuple[Any, int, int]]
"""What one ``PartWriter.encode`` wrote for each container it took whole: its id -> (the container, where its
opcodes start and end in the encoding)."""

_CONTAINERS = frozenset((list, tuple, dict, set, frozenset))
_FRAME = pickle.FRAME[0]
_FRAME_MIN = 4
"""The C pickler leaves a frame shorter than this without its header."""


class _Unframed(Exception):
    """A part's pickle holds a write the pickler made outside any frame (a string or bytes of 64 KiB or more):
    where its opcodes end cannot be told without parsing them."""


class PartWriter:
    """``encode`` for a value that changed since it was last encoded, reusing the bytes written then for every
    part it still shares — the very same object.

    Why: business logic never mutates a payload, so a new version of a
    large one (a word's posting list in the inverted index, kept in shards
    so that a new page copies one of them) shares most of its parts with
    the version before it.  A snapshot re-encoded such buckets whole each
    time one of their words changed: 10 MB a second for a worker's share
    of a 3,000-page index, half a second of CPU.  Pickle without the memo
    writes each part as a run of opcodes that means the same wherever it
    stands, so the encoding of a list or tuple is its items' runs between
    a mark and the container's opcode, and a run written before can be
    copied instead of pickled again.

    The writer goes into lists and tuples that hold containers (up to
    ``REUSE_DEPTH`` levels) and takes any other value whole, through the
    C pickler; a container taken whole is looked up by identity in what
    the previous encoding wrote (``Parts``, which holds the object, so its
    id cannot be reused meanwhile).  The result decodes like ``encode``'s,
    with ``decode``.
    """

    def __init__(self) -> None:
        self._out = _Capped()
        self._pickler = _fast(self._out)

    def encode(self, value: Any, before: tuple[bytes, Parts] | None = None) -> tuple[bytes, Parts]:
        """``value`` encoded, and its parts for the next call; ``before`` is an earlier call's result.
        Falls back to ``encode`` (no parts) for a value it cannot cut into runs: cyclic, too large without the
        memo, or holding an unframed write; ValueError if it is not plain."""
        previous, known = (memoryview(before[0]), before[1]) if before is not None else (memoryview(b""), {})
        pieces: list[bytes | memoryview] = [pickle.PROTO + b"\x05"]
        parts: Parts = {}
        runs: dict[int, bytes | memoryview] = {}
        end = len(pieces[0])

        def put(piece: bytes | memoryview) -> None:
            nonlocal end
            end += len(piece)
            if end > FAST_LIMIT:  # a part met many times over is copied each time, as the fast pickler writes it
                raise _Spilled
            pieces.append(piece)

        def walk(part: Any, depth: int) -> None:
            kind = type(part)
            if (kind is list or kind is tuple) and depth < REUSE_DEPTH and not _CONTAINERS.isdisjoint(map(type, part)):
                put(pickle.EMPTY_LIST + pickle.MARK if kind is list else pickle.MARK)
                for item in part:
                    walk(item, depth + 1)
                put(pickle.APPENDS if kind is list else pickle.TUPLE)
                return
            if kind not in _CONTAINERS:
                put(self._run(part))
                return
            key = id(part)
            run = runs.get(key)
            if run is None:
                hit = known.get(key)
                run = previous[hit[1]:hit[2]] if hit is not None and hit[0] is part else self._run(part)
                runs[key] = run
                parts[key] = (part, end, end + len(run))
            put(run)

        try:
            walk(value, 0)
        except (_Unframed, _Spilled, pickle.PicklingError, RecursionError, ValueError):
            self._pickler = _fast(self._out)  # its state after an interrupted dump is not known
            return encode(value), {}
        put(pickle.STOP)
        return b"".join(pieces), parts

    def _run(self, part: Any) -> bytes:
        """The opcodes the fast pickler writes for ``part``, without the protocol header, frames and STOP."""
        out = self._out
        out.seek(0)
        out.truncate()
        self._pickler.dump(part)
        data = out.getvalue()
        if len(data) > 2 and data[2] == _FRAME and int.from_bytes(data[3:11], "little") == len(data) - 11:
            return data[11:-1]  # one frame: by far the commonest
        runs = []
        at = 2
        while at < len(data):
            if data[at] == _FRAME:
                size = int.from_bytes(data[at + 1:at + 9], "little")
                runs.append(data[at + 9:at + 9 + size])
                at += 9 + size
            elif len(data) - at < _FRAME_MIN:
                runs.append(data[at:])
                break
            else:
                raise _Unframed
        return b"".join(runs)[:-1]


def decode(data: bytes) -> Any:
    """The value ``encode`` wrote; ValueError (never anything else, never code) for bytes it did not write."""
    values = decode_all(data)
    if len(values) != 1:
        raise ValueError(f"not an encoded value: {len(values)} values")
    return values[0]


def decode_all(data: bytes) -> list[Any]:
    """The values of ``encode`` results written one after another (``b"".join``), in order.

    Why several: one pickle of a large state holds the GIL for its whole
    encoding (60 ms for 3 MB), long enough to show in every latency the
    process measures meanwhile; chunks let the event loop run in between.
    """
    return [value for value, _end in _loads(data)]


def decode_chunks(data: bytes) -> list[tuple[Any, bytes]]:
    """``decode_all``'s values, each with the bytes it was decoded from: a worker that takes a snapshot's buckets
    over keeps their encoding instead of encoding its whole state again at its next snapshot."""
    chunks = []
    start = 0
    for value, end in _loads(data):
        chunks.append((value, data[start:end]))
        start = end
    return chunks


def _loads(data: bytes) -> list[tuple[Any, int]]:
    """Each value of ``data`` with the offset its encoding ends at."""
    stream = io.BytesIO(data)
    loaded = []
    try:
        while stream.tell() < len(data):  # one unpickler each: memo indexes restart per pickle
            loaded.append((_PlainUnpickler(stream).load(), stream.tell()))
    except Exception as exc:  # a crafted or torn pickle can raise almost any error type while being read
        raise ValueError(f"not an encoded value: {exc!r}") from exc
    return loaded
