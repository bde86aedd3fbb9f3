"""Balancing functions: payload -> int32 hash (paper §2.3).

Python's built-in ``hash`` of ``str`` is salted per process, so two workers
would disagree on where a word lives.  Everything here is stable across
processes and machines.
"""

from __future__ import annotations

import json
import operator
import reprlib
import zlib
from collections.abc import Mapping, Set
from typing import Any, Final

from flamestream.core.errors import BalanceError as BalanceError  # re-exported: defined there for mypyc

INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1

_crc32: Final = zlib.crc32
"""Held in a C static of the compiled module: ``zlib.crc32`` looked the attribute up on the module at every hash
(mypyc), 260 instructions a word on word count."""


def to_int32(value: int) -> int:
    """Fold any int into the signed 32-bit range hash ranges are cut from: two's-complement wrap, i.e. the low 32
    bits read as a signed number (``2**32 + 5 -> 5``, ``2**31 -> -2**31``, ``-1 -> -1``)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value > INT32_MAX else value


def as_hash(value: object) -> int:
    """The int32 hash a balancing function's result stands for; ``BalanceError`` if it stands for none.

    Every place that balances — the front, the cluster worker, the local
    runtime, the oracle, Spark replay — passes results through here, so they
    all agree on where an item lives and on which items fail.  Why fold rather
    than refuse big ints: ``hash``-like arithmetic (``a * 31 + b``) overflows
    int32 easily and is deterministic, so folding it (``to_int32``: the low 32
    bits, two's complement) is what the function meant; left unfolded, such a
    hash lay in no worker's range (a replicated copy kept nowhere, ``Layout.owner``
    of -1).  Integers are ``int`` and anything with ``__index__`` (numpy
    integers).  ``bool`` is accepted as the int it is (``True`` is 1): it is
    deterministic and equal to 1 in every Python, so refusing it would only
    punish ``lambda p: p["flag"]``.  Anything else — ``None``, ``str``,
    ``float`` (even ``3.0``: a float hash is usually a bug that rounding would
    hide) — has no hash.
    """
    if type(value) is int:  # the fast path: what stable_hash and nearly every function return
        return value if INT32_MIN <= value <= INT32_MAX else to_int32(value)
    try:
        index = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise BalanceError(f"balancing function returned {_described(value)}, not an integer") from None
    return to_int32(index)


def _described(value: object) -> str:
    """A short, deterministic text of a bad result for the error message (it ends up in a dead letter)."""
    kind = type(value).__name__
    if value is None or type(value) in (str, bytes, float):
        return f"{reprlib.repr(value)} ({kind})"  # bounded size; str reprs escape lone surrogates
    return f"a value of type {kind}"  # other reprs (a container's too) may show an address, or fail


STR_HASHES: Final = 1 << 16
"""Most strings whose hashes ``stable_hash`` remembers; past that it forgets them all and starts again."""
STR_HASHED_LENGTH: Final = 64
"""The longest string whose hash is remembered: together with ``STR_HASHES``, at most ~11 MB held for it."""
_str_hashes: Final[dict[str, int]] = {}
"""String -> its hash, for the short strings hashed lately.  Why: a word count or an index hashes each word twice
per occurrence (routing the word, then its accumulator), most of them words seen before; encoding the string and
calling CRC-32 took ~900 instructions a hash, a lookup of a string (which keeps its own ``hash``) a fraction.  The
hash is a function of the string alone, so what is remembered changes no result, only the cost."""


def stable_hash(payload: Any) -> int:
    """A process-independent int32 hash of a payload: equal payloads (``==``) hash equally.

    A str hashes as the CRC-32 of its UTF-8, and bytes as their own CRC-32, as
    they always have, so a deployed layout keeps routing words where it did;
    every other payload hashes as the CRC-32 of its ``_canonical`` text.
    """
    if isinstance(payload, str):
        if len(payload) > STR_HASHED_LENGTH:  # a document, say: rarely hashed twice, and it would be kept alive
            return to_int32(_crc32(payload.encode()))
        known = _str_hashes.get(payload)
        if known is None:
            known = to_int32(_crc32(payload.encode()))
            if len(_str_hashes) >= STR_HASHES:
                _str_hashes.clear()
            _str_hashes[payload] = known
        return known
    if isinstance(payload, (bytes, bytearray)):  # bytearray(b"a") == b"a"
        return to_int32(_crc32(payload))
    return to_int32(_crc32(_canonical(payload).encode()))


def _canonical(value: Any) -> str:
    """A text of ``value`` that equal values share, whatever the process, its hash seed or the insertion order.

    ``repr`` is not that: a dict shows its insertion order, a set its hash
    order (which follows the per-process string hash seed), and ``1``,
    ``1.0`` and ``True`` are equal yet print differently.  So:

    * numbers that equal an int (bools, integral floats, ``-0.0``) are that
      int in decimal; other floats are their ``repr`` (``0.5``, ``inf``;
      NaN equals nothing, so ``nan`` needs no care);
    * str is its JSON string (ASCII escapes, so it does not depend on the
      Unicode tables of the interpreter), bytes and bytearray their bytes
      ``repr``, None is ``None``;
    * lists and tuples (named tuples included, as they equal plain tuples) are
      their elements in order, ``[...]`` and ``(...)``;
    * mappings and sets (any ``Mapping``/``Set``, so an ``OrderedDict`` equals
      its dict, a ``frozenset`` its set) are their items' texts sorted, so
      neither insertion nor hash order shows: ``{k:v,...}`` and ``<...>``;
    * a class is its qualified name.

    Any other type is its qualified name followed by the text of its
    attributes (``vars``) when it has a ``__dict__`` (dataclasses, plain
    classes: never ``repr``, whose default shows the object's address), else
    by its ``repr`` (e.g. ``Decimal``), which must then not show an address.
    Equal values of such a type hash equally only if they have equal
    attributes or reprs, and they never hash like an equal value of another
    type (``Decimal(1)`` does not hash like ``1``).
    """
    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):  # bool included
        return str(int(value))
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else float.__repr__(value)
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value))
    if isinstance(value, list):
        return f"[{','.join(_canonical(item) for item in value)}]"
    if isinstance(value, tuple):
        return f"({','.join(_canonical(item) for item in value)})"
    if isinstance(value, Mapping):
        items = sorted(f"{_canonical(key)}:{_canonical(item)}" for key, item in value.items())
        return f"{{{','.join(items)}}}"
    if isinstance(value, Set):
        return f"<{','.join(sorted(_canonical(item) for item in value))}>"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    attributes = getattr(value, "__dict__", None)
    return f"{name}{_canonical(attributes)}" if isinstance(attributes, Mapping) else f"{name}({value!r})"


def constant_hash(payload: Any) -> int:
    """Send everything to one place (a global reduce)."""
    return 0
