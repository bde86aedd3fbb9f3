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


def encode(value: Any) -> bytes:
    """``value`` as bytes that ``decode`` turns back into an equal value of the same types."""
    out = io.BytesIO()
    try:
        _PlainPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except (pickle.PicklingError, RecursionError) as exc:
        raise ValueError(f"cannot encode the value: {exc}") from exc
    return out.getvalue()


def encode_each(values: Iterable[Any]) -> Iterator[bytes]:
    """``encode`` of each value in turn, through one pickler: a snapshot encodes thousands of small buckets
    each second, and a pickler per value would cost more than most of them."""
    out = io.BytesIO()
    pickler = _PlainPickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    for value in values:
        out.seek(0)
        out.truncate()
        pickler.clear_memo()  # each result stands alone: decode_all reads each with a fresh unpickler
        try:
            pickler.dump(value)
        except (pickle.PicklingError, RecursionError) as exc:
            raise ValueError(f"cannot encode the value: {exc}") from exc
        yield out.getvalue()


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
    stream = io.BytesIO(data)
    values = []
    try:
        while stream.tell() < len(data):
            values.append(_PlainUnpickler(stream).load())  # one unpickler each: memo indexes restart per pickle
    except Exception as exc:  # a crafted or torn pickle can raise almost any error type while being read
        raise ValueError(f"not an encoded value: {exc!r}") from exc
    return values
