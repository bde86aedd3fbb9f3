"""Garbage-collector settings for processes that hold stream state.

CPython's cyclic collector runs a young collection every 700 net
allocations and, every so often, walks every tracked object.  A stream
processor allocates a few tuples per item per operation while its heap keeps
growing (grouping buckets, barrier slots, a consumer's records), so with the
defaults the collector took 44% of the worker core's time on the inverted
index (60.8 -> 34.0 us per changelog record with it off).  Items and
payloads are acyclic: reference counting frees them, and the cyclic collector
finds almost nothing.  So it runs a hundred times less often, and what
start-up loaded (modules, generated protobuf classes) is frozen out of its
walks.  Cyclic garbage is still collected, only later.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 70_000
"""Net allocations between young collections (CPython's default: 700)."""


def tune_gc() -> None:
    """Collect cycles rarely and stop walking the start-up heap (call once the process has loaded its code)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 100)


@contextlib.contextmanager
def loading_state() -> Iterator[None]:
    """Pause the cyclic collector while a large state is built, then freeze what was built out of its walks.

    Why: decoding a snapshot builds millions of acyclic objects (89 MB of
    inverted index), and with the collector on, its young and middle
    collections walked them over and over: the decode took 2.0-2.6 s instead
    of 0.9-1.1 s.  Re-enabled afterwards, its next collection would walk them
    all once more on the event loop; frozen, they are freed by reference
    counting as they are replaced, like the start-up heap (``tune_gc``).
    The pause is process-wide; it lasts as long as the load.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
