"""Business logic for tests/test_semantics.py (graphs need importable functions)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def parity(x: int) -> int:
    return x % 2


def identity(x: Any) -> list[Any]:
    return [x]


def as_mapped(x: int) -> list[tuple[str, int]]:
    return [("m", x)]


def zero(_: Any) -> int:
    return 0


def running_sum(window: tuple[Any, ...]) -> list[tuple[str, int]]:
    """(m,) starts the sum, (acc, m) extends it, everything else is dropped."""
    if len(window) == 1:
        return [("acc", window[0][1])] if window[0][0] == "m" else []
    acc, m = window
    return [("acc", acc[1] + m[1])] if acc[0] == "acc" and m[0] == "m" else []


def fragile(x: int) -> list[int]:
    if x % 5 == 0:
        raise ValueError(f"cannot handle {x}")
    return [x]


def picky_hash(x: int) -> int:
    if x < 0:
        raise KeyError("negative")
    return x


SPREAD_CALLS: Counter[int] = Counter()
"""Calls of ``spread`` per input: tests/test_replicated_entry.py counts how often workers run an entry map."""


def spread(x: int) -> list[int]:
    """Fails on multiples of 5; otherwise three outputs, one negative (``picky_hash`` fails on it)."""
    SPREAD_CALLS[x] += 1
    if x % 5 == 0:
        raise ValueError(f"cannot spread {x}")
    return [x, -x, x + 1000]
