"""Balancing functions: payload -> int32 hash (paper §2.3).

Python's built-in ``hash`` of ``str`` is salted per process, so two workers
would disagree on where a word lives.  Everything here is stable across
processes and machines.
"""

from __future__ import annotations

import zlib
from typing import Any

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def to_int32(value: int) -> int:
    """Fold any int into the signed 32-bit range hash ranges are cut from."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value > INT32_MAX else value


def stable_hash(payload: Any) -> int:
    """A process-independent int32 hash of a payload (via its ``repr``)."""
    if isinstance(payload, str):
        data = payload.encode()
    elif isinstance(payload, bytes):
        data = payload
    else:
        data = repr(payload).encode()
    return to_int32(zlib.crc32(data))


def constant_hash(payload: Any) -> int:
    """Send everything to one place (a global reduce)."""
    return 0
