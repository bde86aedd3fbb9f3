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
import os
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
    """Pickler output that refuses to grow past ``limit`` (``FAST_LIMIT`` unless given).  The C pickler writes whole
    frames (64 KB), so the check costs nothing per object."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self._limit = FAST_LIMIT if limit is None else limit

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self._limit:
            raise _Spilled
        return super().write(data)


_FAST_FAILURES = (_Spilled, pickle.PicklingError, RecursionError, ValueError, KeyError)
"""What a pickler without the memo raises for a value it cannot write so.  ValueError: a cycle, or not plain.
KeyError: CPython's C pickler in fast mode counts a frozenset into its nesting depth and never out again; past 50
it keeps ids to detect cycles, and the next container it leaves is not among them (some fifty frozensets in one
value, found by hypothesis).  With the memo, all of these are written (or refused) properly."""


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


_CHUNK = 512
"""Values ``fragments`` encodes in one pickler call by default: an index's rows (30-70 bytes each, and a separator's
18) fit in one frame."""


def fragments(values: list[Any], chunk: int = _CHUNK) -> list[bytes | None]:
    """Each value's encoding without the protocol header, frame and stop around it, for ``encode_pair`` to join;
    None for a value that is large (more than one frame), needs the memo (shared or cyclic parts) or is not plain.

    Why: a snapshot file starts each grouping with an index of every bucket (``storage/snapshots.py``), and
    encoding its twenty thousand rows again at every periodic snapshot cost half as much as encoding the buckets
    that changed.  A row encoded when its bucket changes is joined as it is.  How, cheaply: a pickler call per
    value cost five to eight times the value's own encoding, so a chunk of values goes in one call, as a tuple
    with a random separator after each, and is cut apart where the separators are.  A chunk that fails, or
    does not fit in one frame (its output is capped there), is tried again in halves, down to single values:
    values larger than a few dozen bytes want a smaller ``chunk`` than the default, or most chunks are encoded
    more than once.
    """
    codes: list[bytes | None] = []
    for at in range(0, len(values), chunk):
        codes += _fragments(values[at:at + chunk])
    return codes


_ONE_FRAME = 60_000
"""Output below the pickler's frame size (64 KiB) is one frame, and holds no string or bytes written outside it."""


def _border_free_cut() -> bytes:
    """The encoding of a random 16-byte separator whose every prefix differs from its suffix of that length.

    Random, so that no value (business logic's keys) holds it: a value that did would cut into more pieces
    than there are values, which ``_fragments`` checks.  Border-free, so that the count check is enough: an
    encoding whose start equals its end could share bytes with a value's end, and cut there, one byte early,
    with the count unchanged.
    """
    while True:
        cut = pickle.SHORT_BINBYTES + bytes([16]) + os.urandom(16)
        if all(cut[:k] != cut[-k:] for k in range(1, len(cut))):
            return cut


_CUT = _border_free_cut()
_SEPARATOR = _CUT[2:]
HOLE = _border_free_cut()
"""What ``splice`` puts where a part goes, encoded: a second random separator, since ``fragments`` cuts at ``_CUT``."""
PLACEHOLDER = HOLE[2:]


def _fragments(values: list[Any]) -> list[bytes | None]:
    out = _Capped(_ONE_FRAME)
    try:
        _fast(out).dump(tuple([part for value in values for part in (value, _SEPARATOR)] + [_SEPARATOR] * 2))
        data = out.getvalue()
    except _FAST_FAILURES:
        data = b""
    if data:
        # The header (2 bytes), the frame's opcode and length (9), MARK, value, cut, ..., cut, cut, cut, TUPLE, STOP.
        pieces: list[bytes | None] = list(data[12:-2].split(_CUT))
        if len(pieces) == len(values) + 3 and pieces[-3:] == [b"", b"", b""]:
            return pieces[:-3]
    if len(values) == 1:
        return [None]
    half = len(values) // 2
    return _fragments(values[:half]) + _fragments(values[half:])


HEADER = pickle.PROTO + bytes([pickle.HIGHEST_PROTOCOL])


def encode_pair(head: bytes, items: Iterable[bytes]) -> bytes:
    """``encode([a, [b, c, ...]])`` from the ``fragments`` of ``a``, ``b``, ``c``...: a list and a mark (``](``),
    the head, a second list and mark, the items, two APPENDS (``e``) and the stop, in one frame.  Why the frame:
    the unpickler reads a frame's bytes in one call, and an unframed index of 20,000 rows in one call per opcode
    (280,000 reads from a ``BytesIO``, 1.7 times the decoding time)."""
    parts = [b"](", head, b"](", *items, b"ee."]
    return b"".join([HEADER, pickle.FRAME, sum(map(len, parts)).to_bytes(8, "little"), *parts])


def _without_memo(pickler: _PlainPickler, out: _Capped, value: Any) -> bytes | None:
    """``value`` written by the fast ``pickler`` into ``out``, or None if it spilled, is cyclic or not plain."""
    out.seek(0)
    out.truncate()
    try:
        pickler.dump(value)
    except _FAST_FAILURES:
        return None
    return out.getvalue()


def _with_memo(value: Any) -> bytes:
    out = io.BytesIO()
    try:
        _PlainPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except (pickle.PicklingError, RecursionError) as exc:
        raise ValueError(f"cannot encode the value: {exc}") from exc
    return out.getvalue()


def decode(data: bytes | memoryview) -> Any:
    """The value ``encode`` wrote; ValueError (never anything else, never code) for bytes it did not write."""
    values = decode_all(data)
    if len(values) != 1:
        raise ValueError(f"not an encoded value: {len(values)} values")
    return values[0]


def decode_all(data: bytes | memoryview) -> list[Any]:
    """The values of ``encode`` results written one after another (``b"".join``), in order.

    Why several: one pickle of a large state holds the GIL for its whole
    encoding (60 ms for 3 MB), long enough to show in every latency the
    process measures meanwhile; chunks let the event loop run in between.
    """
    stream = io.BytesIO(data)
    loaded = []
    while stream.tell() < len(data):  # one unpickler each: memo indexes restart per pickle
        loaded.append(decode_next(stream))
    return loaded


def decode_next(stream: io.BytesIO) -> Any:
    """The value whose encoding starts at ``stream``'s position, leaving the position where it ends: a reader
    that skips what it does not need yet (a snapshot's bucket entries) takes the values it does one at a time."""
    try:
        return _PlainUnpickler(stream).load()
    except Exception as exc:  # a crafted or torn pickle can raise almost any error type while being read
        raise ValueError(f"not an encoded value: {exc!r}") from exc
