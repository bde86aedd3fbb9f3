"""A safe, exact encoding of payload values: what grouping state is made of, as bytes.

Grouping state holds whatever business logic produced: tuples (every window
is one), dicts with non-string keys, sets, integers beyond 64 bits, NaN.
JSON loses most of that (a tuple comes back a list, and equal payloads must
stay equal or a restored state would group differently), and pickle executes
code when it decodes, which nothing read back from disk or another process
may do.  So values are written as JSON in which every non-JSON shape is a
one-key object naming its type::

    tuple {"t": [...]}          dict with str keys {"m": {...}}     other dict {"d": [[k, v], ...]}
    set {"s": [...]}            frozenset {"z": [...]}              bytes {"b": "<base64>"}
    float nan/inf {"f": "nan"}  int beyond 64 bits {"i": "<digits>"}

A plain JSON object never occurs at the top of a value's encoding (every dict
is wrapped), so decoding is unambiguous and can only build these types.
Other types (a user's class) are refused with ``ValueError`` naming them.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import orjson

_INT64 = 1 << 63


def _wrap(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else {"i": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [_wrap(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"m": {k: _wrap(v) for k, v in value.items()}}
        return {"d": [[_wrap(k), _wrap(v)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"z": [_wrap(v) for v in value]}
    if isinstance(value, set):
        return {"s": [_wrap(v) for v in value]}
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode("ascii")}
    raise ValueError(f"a value of type {type(value).__qualname__} cannot be encoded (only JSON values, tuples, "
                     "dicts, sets, frozensets and bytes can)")


def _unwrap(node: Any) -> Any:
    if isinstance(node, list):
        return [_unwrap(v) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) != 1:
        raise ValueError(f"not an encoded value: an object with keys {sorted(node)[:5]}")
    (tag, body), = node.items()
    if tag == "t":
        return tuple(_unwrap(v) for v in _list(body))
    if tag == "m":
        if not isinstance(body, dict):
            raise ValueError("not an encoded value: 'm' holds no object")
        return {k: _unwrap(v) for k, v in body.items()}
    if tag == "d":
        pairs = [_list(pair) for pair in _list(body)]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("not an encoded value: a dict entry is not a pair")
        return {_unwrap(k): _unwrap(v) for k, v in pairs}
    if tag == "s":
        return {_unwrap(v) for v in _list(body)}
    if tag == "z":
        return frozenset(_unwrap(v) for v in _list(body))
    if tag == "b" and isinstance(body, str):
        return base64.b64decode(body, validate=True)
    if tag == "f" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "i" and isinstance(body, str) and body.lstrip("-").isdigit():
        return int(body)
    raise ValueError(f"not an encoded value: unknown tag {tag!r}")


def _list(node: Any) -> list[Any]:
    if not isinstance(node, list):
        raise ValueError(f"not an encoded value: expected a list, got {type(node).__name__}")
    return node


def encode(value: Any) -> bytes:
    """``value`` as bytes that ``decode`` turns back into an equal value of the same types."""
    return orjson.dumps(_wrap(value))


def decode(data: bytes) -> Any:
    """The value ``encode`` wrote; ValueError (never anything else, never code) for bytes it did not write."""
    try:
        return _unwrap(orjson.loads(data))
    except (orjson.JSONDecodeError, TypeError, RecursionError, UnicodeError, binascii.Error) as exc:
        raise ValueError(f"not an encoded value: {exc}") from exc
