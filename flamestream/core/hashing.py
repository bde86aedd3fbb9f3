"""Balancing functions: payload -> int32 hash (paper §2.3).

Python's built-in ``hash`` of ``str`` is salted per process, so two workers
would disagree on where a word lives.  Everything here is stable across
processes and machines.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Set
from typing import Any

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def to_int32(value: int) -> int:
    """Fold any int into the signed 32-bit range hash ranges are cut from."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value > INT32_MAX else value


def stable_hash(payload: Any) -> int:
    """A process-independent int32 hash of a payload: equal payloads (``==``) hash equally.

    A str hashes as the CRC-32 of its UTF-8, and bytes as their own CRC-32, as
    they always have, so a deployed layout keeps routing words where it did;
    every other payload hashes as the CRC-32 of its ``_canonical`` text.
    """
    if isinstance(payload, str):
        return to_int32(zlib.crc32(payload.encode()))
    if isinstance(payload, bytes | bytearray):  # bytearray(b"a") == b"a"
        return to_int32(zlib.crc32(payload))
    return to_int32(zlib.crc32(_canonical(payload).encode()))


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
    if isinstance(value, bytes | bytearray):
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
