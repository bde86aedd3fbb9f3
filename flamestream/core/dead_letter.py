"""What happens when business logic raises: the item becomes a dead letter.

A user function (map, balancing or equivalence) that raises must not kill a
worker, and silently dropping the item would be data loss.  The failing item
is turned into a dead-letter record and sent straight to the barrier with the
failing item's meta, so it is released exactly once like any output — and a
later retraction of that item retracts its dead letter too, because the same
deterministic failure happens again on the tombstone.
"""

from __future__ import annotations

from typing import Any

DEAD_LETTER = "dead_letter"


def dead_letter(operation: str, error: BaseException, payload: Any) -> dict[str, Any]:
    return {DEAD_LETTER: {"operation": operation, "error": f"{type(error).__name__}: {error}",
                          "payload": repr(payload)}}


def is_dead_letter(payload: Any) -> bool:
    return isinstance(payload, dict) and DEAD_LETTER in payload
