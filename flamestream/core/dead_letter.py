"""What happens when business logic raises: the item becomes a dead letter.

A user function (map, balancing or equivalence) that raises — or a balancing
function that returns no integer (``hashing.as_hash``) — must not kill a
worker, and silently dropping the item would be data loss.  The failing item
is turned into a dead-letter record and sent straight to the barrier with the
failing item's meta, so it is released exactly once like any output — and a
later retraction of that item retracts its dead letter too, because the same
deterministic failure happens again on the tombstone.

A sink item whose payload cannot be written as a record at all (a lone
surrogate, nesting too deep, a ``repr`` that raises: see
``payload.encode_payload``) becomes the dead letter of the pseudo-operation
``RECORD`` in its place, for the same reasons.

A dead letter must itself always be writable, and be the same wherever it is
made (the oracle's must equal the cluster's): so its texts have lone
surrogates escaped, and a payload too deep to ``repr`` deterministically is
shown by its type only.
"""

from __future__ import annotations

from typing import Any, Final

DEAD_LETTER: Final = "dead_letter"

RECORD: Final = "<record>"
"""The ``operation`` of a sink item's dead letter when its payload could not be written as a record."""

MAX_SHOWN_DEPTH: Final = 254
"""Payloads nested deeper are shown as ``<list nested deeper than 254 levels>``: ``repr`` recurses, and where
it runs out of stack depends on the caller's stack, so the text would differ between processes."""


def dead_letter(operation: str, error: BaseException, payload: Any) -> dict[str, Any]:
    return {DEAD_LETTER: {"operation": operation, "error": writable(f"{type(error).__name__}: {_message(error)}"),
                          "payload": shown(payload)}}


def is_dead_letter(payload: Any) -> bool:
    return isinstance(payload, dict) and DEAD_LETTER in payload


def shown(payload: Any) -> str:
    """``repr(payload)``, made safe to write: never raises, never holds a lone surrogate, deterministic in depth."""
    if deeper_than(payload, MAX_SHOWN_DEPTH):
        return f"<{type(payload).__name__} nested deeper than {MAX_SHOWN_DEPTH} levels>"
    try:
        return writable(repr(payload))
    except Exception as exc:  # a user type whose __repr__ raises
        return f"<{type(payload).__name__} whose repr failed: {type(exc).__name__}>"


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # an exception whose __str__ raises
        return "<no message>"


def writable(text: str) -> str:
    """``text`` with lone surrogates as ``\\udXXX`` escapes, so it encodes as UTF-8 (and JSON) for sure."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists, tuples, dicts or sets more than ``limit`` levels deep (a cycle counts).

    Iterative, so no depth can make it raise.  A container already seen at the
    same or a greater depth is not walked again, so shared substructure (``a = [a,
    a]`` many times over) costs one walk per depth at most, not one per path.
    """
    seen: dict[int, int] = {}
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, set, frozenset, dict)):
            depth += 1
            if depth > limit:
                return True
            if seen.get(id(item), 0) >= depth:
                continue
            seen[id(item)] = depth
            stack.extend((child, depth) for child in item)  # a dict's keys
            if isinstance(item, dict):
                stack.extend((child, depth) for child in item.values())
    return False
