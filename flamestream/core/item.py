"""Data items as they travel between operations: (payload, global time, trace, tombstone).

Plain tuples on purpose: an item is created at every hop of every record, and
a tuple literal costs a fraction of a class instance.  ``tombstone`` marks a
retraction: the item with exactly this meta was emitted by a grouping that has
since changed its mind.  A tombstone carries the retracted payload, so it
hashes and routes exactly like the item it cancels and reaches every grouping
state and barrier that item reached (the fix for chained groupings).
"""

from __future__ import annotations

from typing import Any

from flamestream.core.meta import GlobalTime, Trace

Item = tuple[Any, GlobalTime, Trace, bool]

Envelope = tuple[int, int | None, Item]
"""(destination operation index, its balancing hash if computed, item)."""


def item_time(item: Item) -> GlobalTime:
    return item[1]


def item_meta(item: Item) -> tuple[GlobalTime, Trace]:
    """Sort key: the model's total order."""
    return item[1], item[2]


def envelope_time(env: Envelope) -> GlobalTime:
    return env[2][1]


def envelope_meta(env: Envelope) -> tuple[GlobalTime, Trace]:
    """Sort key of an envelope: its item's meta."""
    return env[2][1], env[2][2]
