"""Resource limits that every process must apply identically: outputs per item, names and sequence numbers.

Why here, in the pure core: a limit that decides what an item produces is
part of the stream's semantics.  The oracle, the local runtime, Spark replay
and every worker of a cluster must cut the same items, or they would disagree
on the output; so the limits travel with the graph (``Graph.max_outputs``,
``Graph.max_output_bytes``, shipped in the tick) instead of being node flags.
The name and sequence checks live here so the SDK (which may import only the
core) and the services refuse exactly the same values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Final

MAX_OUTPUTS: Final = 10_000
"""Default cap on the outputs one map call may produce for one item (``Graph.max_outputs``)."""

MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024
"""Default cap on the estimated size of one map call's outputs (``Graph.max_output_bytes``)."""

MAX_NAME_BYTES: Final = 256
"""Longest producer id and consumer-group name (UTF-8 bytes): both are keys held in memory, in the input log
and in ZooKeeper paths, where a megabyte-long name breaks the session (ZooKeeper's packet limit)."""

MAX_SEQUENCE: Final = 2**63 - 1
"""Largest producer sequence number a front admits.  Sequences must grow, so a producer that once reached the
top of the wire's uint64 range (2**64 - 1) could never be admitted again; keeping them below 2**63 leaves any
producer that numbers from 0, or by nanosecond timestamps, room for centuries, and fits a signed int64."""

RESERVED_PREFIX: Final = "~"
"""Producer ids starting with this are internal: the SDK's anonymous ids (``client.ANONYMOUS``)."""

ANONYMOUS_ID: Final = re.compile(r"~anon-[0-9a-f]{32}-[0-9]{1,10}")
"""The only reserved producer ids a front accepts: the SDK's anonymous ids, a random 128-bit token per lane of a
client (plus the front id).  Any other ``~`` id is refused, so a caller cannot pick an id in the SDK's namespace by
accident, and it cannot take another client's without knowing that client's secret token."""

RETRY_HINT: Final = "(transient: retry after a backoff)"
"""Ends a RESOURCE_EXHAUSTED message that a retry may overcome (disk full, too many events in flight); the SDK
retries those and gives up at once on the permanent ones (an event or a request too large)."""

_GROUP_CHARS: Final = re.compile(r"[A-Za-z0-9._:@+=-]+")


class OutputLimitError(Exception):
    """One item's map produced more than the graph allows: the item's dead letter (see ``bounded_outputs``)."""


def bounded_outputs(results: Iterable[Any], max_count: int, max_bytes: int) -> Sequence[Any]:
    """The outputs of one map call, or ``OutputLimitError`` if there are more than ``max_count`` of them or
    their estimated size exceeds ``max_bytes``.

    Why: a flat map amplifies.  One 400 KB line of word count is ~70,000
    words, each an item with its own acks, grouping window and record;
    a hundred such lines drove a worker past 6 GB.  Cutting the item at the
    map bounds what one event can cost.  A generator is read only up to one
    past the cap, so even an endless one stops.  The whole item fails (its
    dead letter), not a truncated prefix: a silently shortened output would
    be wrong data, a dead letter is visible.  Deterministic, so a tombstone
    of the item fails the same way and retracts the dead letter.
    """
    # A list or tuple is taken as it is (the worker only reads it, at once); anything else is read up to the cap.
    outs = results if type(results) is list or type(results) is tuple else list(islice(results, max_count + 1))
    if len(outs) > max_count:
        raise OutputLimitError(f"more than {max_count} outputs for one item (the graph's max_outputs)")
    if len(outs) < 2:
        return outs  # one output cannot amplify (a reduce's growing accumulator is one output, walked every time)
    total = 0
    for out in outs:
        total += len(out) if type(out) is str else estimated_size(out, max_bytes - total)
        if total > max_bytes:
            raise OutputLimitError(f"outputs of one item exceed an estimated {max_bytes} bytes "
                                   "(the graph's max_output_bytes)")
    return outs


def estimated_size(value: Any, budget: int) -> int:
    """A cheap, deterministic size estimate of ``value`` (about its JSON length), walked only until it exceeds
    ``budget``: strings and bytes by length, containers by their elements plus 2 per element, scalars 8.

    Shared substructure counts every time it appears, as it would when written out; stopping at the budget
    keeps cycles and huge repeats from costing more than the cap they break.

    A tuple's or list's numbers, None and strings are counted in place, by exact type, instead of each taking
    a turn on the stack through ``isinstance`` tests of type unions (compiled, those cost the most): every
    map output with more than one item is walked, an inverted-index page's postings among them, and that walk
    was an eighth of the compiled core's time (6.5-7.1 us a posting, now 0.3-0.5).  Subclasses still go the
    long way, so every value counts what it did.
    """
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is tuple or kind is list:
            total += 2 + 2 * len(item)
            for part in item:
                if total > budget:
                    break
                kind = type(part)
                if kind is int or kind is float or part is None or kind is bool:
                    total += 8
                elif kind is str or kind is bytes:
                    total += len(part) + 2
                else:
                    stack.append(part)
        elif isinstance(item, (str, bytes, bytearray)):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        else:
            total += 8
        if total > budget:
            break
    return total


def producer_fault(producer: str) -> str | None:
    """Why a front refuses ``producer`` as a client-supplied producer id, or None (the empty id is anonymous)."""
    if len(producer.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"producer id longer than {MAX_NAME_BYTES} bytes"
    if producer.startswith(RESERVED_PREFIX) and ANONYMOUS_ID.fullmatch(producer) is None:
        return f"producer ids starting with {RESERVED_PREFIX!r} are reserved for the SDK's anonymous pushes"
    return None


def sequence_fault(sequence: int) -> str | None:
    """Why a front refuses a producer sequence number, or None."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        return f"sequence {sequence} is above the largest allowed, 2**63 - 1"
    return None


def group_fault(group: object) -> str | None:
    """Why ``group`` cannot be a consumer-group name, or None: 1..256 bytes of letters, digits and ``._:@+=-``,
    not ``.`` or ``..`` (it was a ZooKeeper path component, and a name in the barrier's offsets file is rewritten
    with every commit).  Any object: the SDK passes whatever its caller gave,
    which must be refused with this message (compiled, a ``str`` parameter would raise ``TypeError`` instead)."""
    if not isinstance(group, str) or not group:
        return "consumer group must be a non-empty string"
    if len(group) > MAX_NAME_BYTES:
        return f"consumer group name longer than {MAX_NAME_BYTES} bytes"
    if _GROUP_CHARS.fullmatch(group) is None or group in (".", ".."):
        return (f"consumer group {group!r} may only hold letters, digits and '._:@+=-' "
                "(and is not '.' or '..')")
    return None


PRESSURE_RELEASE: Final = 0.9
"""A worker over its memory budget is back under it only below this share of the budget."""


def over_memory_budget(rss: int, budget: int, was_over: bool) -> bool:
    """Whether a worker whose process holds ``rss`` bytes is over its ``budget`` (bytes; 0 = none): above the
    budget it is, and it stays so until it falls below ``PRESSURE_RELEASE`` of it.

    Why the gap: the fronts stop admitting while any worker is over, and a
    worker hovering at its budget would otherwise switch admission on and off
    with every measurement.
    """
    if budget <= 0:
        return False
    return rss > budget or (was_over and rss >= budget * PRESSURE_RELEASE)
