"""Grouping with optimistic replay (paper §2.5, §3) — the only stateful operation.

Each bucket (items sharing the balancing hash, and the equivalence key if one is
given) is kept sorted by meta.  An arriving item is inserted at its meta
position and the window ending at it is emitted as a tuple whose meta is the
last element's global time and trace plus this grouping's next logical time.

In order (the common case) that is one append and one emission.  Out of order,
every window that now contains the newcomer is re-emitted with a newer logical
time — the paper's replay — so the stale versions become invalid downstream.

Stale versions are also *retracted*: the grouping emits a tombstone for each
window it replaces.  The paper's barrier-side invalidation alone is not enough
once groupings are chained (FlameStream issue #76): a stale tuple may hash to a
different worker than its replacement and would pollute the next grouping's
state forever.  The tombstone carries the stale payload, so it follows the
stale tuple's exact path and undoes it wherever it went, including the next
grouping, which replays in turn.

State is trimmed when the acker's minimal time passes: no future item can sort
before an item with a smaller global time, so a bucket keeps only the last
``window - 1`` such items (the ones later windows may still include).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Hashable
from typing import Any

from flamestream.core.item import Item, item_meta, item_time
from flamestream.core.meta import CHILD_BITS, GlobalTime, Trace

MetaKey = tuple[GlobalTime, Trace]
Entries = list[tuple[MetaKey, Any]]
"""A bucket's items as (meta, payload), in meta order."""
Thaw = Callable[[], Entries]
"""A restored bucket's entries, decoded when called: see ``Grouping.restore_lazily``."""


class StateError(Exception):
    """A restored bucket's entries cannot be decoded: the failure of no item, so ``Worker.run`` lets it through
    (the worker stops, loudly) instead of making it the dead letter of every item that reaches the key."""


class Bucket:
    """Items of one key in meta order, with the mark of the window last emitted at each."""

    __slots__ = ("changed", "deadline", "emitted", "h", "items", "key", "pending")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        """Its key in ``Grouping.buckets``: the deadline lists and the changed keys hold the bucket itself, and
        trimming needs the key only to delete an emptied bucket."""
        self.items: list[Item] = []
        """The items as they arrived (never tombstones), in meta order.  The items themselves, not a (meta,
        payload) pair made of each: that was one more tuple per item, kept until trimming freed it cold, and one
        more list to insert into."""
        self.emitted: list[int] = []
        """The trace mark of the window last emitted at each entry (0: none, as for a restored entry).  Only the
        mark: a retraction rebuilds the window it cancels (``_emit``).  Why: what a bucket holds lives until the
        min time passes, long after the emitted item went downstream, and freeing cold objects there was most
        of trimming (a third of a worker's time in word count's closed loop); the window, its item and its trace
        were three tuples a young collection walked meanwhile, where a mark is one int it does not."""
        self.pending: set[MetaKey] | None = None
        """Tombstones that overtook their item (only on non-FIFO paths)."""
        self.deadline: GlobalTime | None = None
        """Global time of the entry at index window-1 when last noted: nothing is trimmable before min time passes
        it.  Removals only ever move the real one later, so a noted deadline is never too late.  None once the
        bucket left ``Grouping.buckets``: a deadline list's reference to it is then skipped."""
        self.changed = False
        """Whether the key is in its grouping's ``_changed`` already: then an item costs no dict write for it (a
        reduce's key takes two items per input, an item and the accumulator coming back round the cycle)."""
        self.h = 0
        """The hash of its key, for a key (hash, equivalence key) that ``accept_keyed`` found.  Kept, not read from
        ``key``: compiled, ``key[0]`` of a key typed ``Hashable`` is a generic item lookup and a comparison of
        boxed ints, 760 more instructions a word on word count (callgrind) than this native int."""


class Grouping:
    """Buckets items by key and emits window-sized tuples, replaying on disorder."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.buckets: dict[Hashable, Bucket] = {}
        self.clock = 0
        """Logical time: bumped per emission, so re-emissions outrank what they replace."""
        self._deadlines: dict[GlobalTime, list[Bucket]] = {}
        """Buckets by the deadlines noted for them (see ``trim``).  A bucket stays listed under a deadline that an
        earlier one, noted since, superseded; ``_trim_bucket`` skips it when that deadline is popped.  The buckets
        themselves, not their keys: looking a key up again in a dict of tens of thousands (a cache miss for each
        word of the index) was a fifth of trimming."""
        self._times: list[GlobalTime] = []
        """A heap of ``_deadlines``' global times."""
        self._pending_keys: set[Hashable] = set()
        self.replays = 0
        """Windows re-emitted because of out-of-order arrivals or retractions."""
        self.held = 0
        """Items currently held across all buckets (state size), not counting restored buckets not decoded yet."""
        self._changed: dict[Hashable, Bucket] = {}
        """Keys whose ``snapshot`` entries may differ from what ``snapshot_changes`` last reported (insertion
        order, so the report's order never depends on the process's string hashing), with their buckets: a
        bucket deleted since is empty, so it reports no entries, and a key's newer bucket replaces it here
        (``accept`` or ``restore``; a lazy restore, which would not, comes before any item by contract).  Not
        kept for window 1: such a grouping has no state to snapshot, and its keys come and go with every item."""
        self._frozen: dict[Hashable, Thaw] = {}
        """Restored buckets not decoded yet (``restore_lazily``): a key moves into ``buckets`` when first needed."""
        self._by_equivalence: dict[Hashable, Bucket] = {}
        """Equivalence key -> the bucket ``accept_keyed`` last found for it by its pair (the first, where one
        equivalence key comes with several hashes); an entry leaves with its bucket (``_delete``)."""

    def accept(self, key: Hashable, item: Item) -> list[Item]:
        """Insert (or, for a tombstone, remove) ``item``; return emitted tuples and retractions."""
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self._bucket(key)
        return self._accept(bucket, item)

    def accept_keyed(self, h: int, equivalent: Hashable, item: Item) -> list[Item]:
        """``accept((h, equivalent), item)``: for a grouping with an equivalence function, whose keys are such
        pairs.

        Why: a pair looked up was hashed element by element and, found,
        compared with the key element by element (a pair built per item is
        never the key itself): 640 instructions an item on word count.  The
        equivalence key alone (a word, whose hash the string keeps) finds
        the bucket in a fraction of that, so buckets are also found that way
        (``_by_equivalence``) when it names one with this hash.  The pair is
        built only for a key's first item and where one equivalence key comes
        with several hashes (balancing and equivalence functions that
        disagree: each pair is still a bucket of its own).
        """
        bucket = self._by_equivalence.get(equivalent)
        if bucket is None or bucket.h != h:
            key = (h, equivalent)
            found = self.buckets.get(key)
            bucket = found if found is not None else self._bucket(key)
            bucket.h = h
            self._by_equivalence.setdefault(equivalent, bucket)
        return self._accept(bucket, item)

    def _accept(self, bucket: Bucket, item: Item) -> list[Item]:
        _, gt, trace, tombstone = item
        if not bucket.changed and self.window > 1:
            bucket.changed = True
            self._changed[bucket.key] = bucket
        if tombstone:
            return self._remove(bucket.key, bucket, (gt, trace))
        if bucket.pending and (gt, trace) in bucket.pending:
            bucket.pending.discard((gt, trace))
            return []
        items = bucket.items
        n = len(items)
        last = items[-1] if n else None
        # In order?  The global time compared by identity first: an event's items share its object (a reduce's
        # accumulator reaches its bucket right after the word it counted), and a tuple comparison costs a call
        # per element where ``is`` costs nothing.
        if last is None or (last[2] < trace if last[1] is gt else last[1] < gt or (last[1] == gt and last[2] < trace)):
            if self.window == 2:
                return self._append_pair(bucket, item, last)
            pos = n
        else:
            meta = (gt, trace)
            pos = bisect_left(items, meta, key=item_meta)
            if pos < n and item_meta(items[pos]) == meta:
                raise ValueError(f"item with meta {meta} delivered twice to a grouping")
        items.insert(pos, item)
        self.held += 1
        bucket.emitted.insert(pos, 0)
        if n + 1 >= self.window and pos < self.window:
            self._note_deadline(bucket)
        return self._emit(bucket, pos, pos + self.window, pos, None)

    def _append_pair(self, bucket: Bucket, item: Item, last: Item | None) -> list[Item]:
        """``accept`` of an item that sorts after all of ``bucket``'s (``last``, or None if it is empty) into a
        window of 2: what ``_emit`` does for it, without its loop.

        Why: that is nearly every item of a reduce (word count, the inverted
        index: a word and then the accumulator coming back round the cycle),
        and the general path paid an insert, a range and a window built by
        position for the one window it emits, none of which replays.
        """
        payload, gt, trace, _ = item
        bucket.items.append(item)
        self.held += 1
        self.clock += 1
        mark: Any = self.clock << CHILD_BITS  # boxed once: the same int in the trace and in ``emitted``
        bucket.emitted.append(mark)
        if last is None:
            return [((payload,), gt, trace + (mark,), False)]
        if len(bucket.items) == 2:  # the entry at window - 1 is new: the bucket's first deadline
            self._note_deadline(bucket)
        return [((last[0], payload), gt, trace + (mark,), False)]

    def _bucket(self, key: Hashable) -> Bucket:
        """The bucket of a key not in ``buckets``: a restored one decoded now, or a new empty one."""
        bucket = Bucket(key)
        if self._frozen:
            thaw = self._frozen.get(key)
            if thaw is not None:
                try:
                    entries = thaw()
                except Exception as exc:
                    raise StateError(f"the restored bucket {key!r} cannot be decoded: {exc}") from exc
                del self._frozen[key]
                self._fill(bucket, entries)
        self.buckets[key] = bucket
        return bucket

    def _fill(self, bucket: Bucket, entries: Entries) -> None:
        bucket.items = [(payload, gt, trace, False) for (gt, trace), payload in entries]
        bucket.emitted = [0] * len(entries)
        self.held += len(entries)

    def _note_deadline(self, bucket: Bucket) -> None:
        deadline = bucket.items[self.window - 1][1]
        if bucket.deadline is None or deadline < bucket.deadline:
            bucket.deadline = deadline
            listed = self._deadlines.get(deadline)
            if listed is None:
                self._deadlines[deadline] = [bucket]
                heapq.heappush(self._times, deadline)
            else:
                listed.append(bucket)

    def _remove(self, key: Hashable, bucket: Bucket, meta: MetaKey) -> list[Item]:
        items = bucket.items
        pos = bisect_left(items, meta, key=item_meta)
        if pos == len(items) or item_meta(items[pos]) != meta:
            if bucket.pending is None:
                bucket.pending = set()
            bucket.pending.add(meta)
            self._pending_keys.add(key)
            return []
        out: list[Item] = []
        removed = items[pos]
        gone = bucket.emitted[pos]
        if gone:
            out.append((_window_at(items, pos, self.window), meta[0], meta[1] + (gone,), True))
        del items[pos], bucket.emitted[pos]
        self.held -= 1
        out.extend(self._emit(bucket, pos, pos + self.window - 1, pos, removed))
        return out

    def _emit(self, bucket: Bucket, start: int, stop: int, changed: int, removed: Item | None) -> list[Item]:
        """(Re-)emit the windows ending at positions ``start .. stop-1``, retracting what each emitted before,
        after the entry at ``changed`` was inserted (``removed`` None) or ``removed``.

        A retraction's window is rebuilt from the entries: the one emitted
        at ``j`` before was the ``window`` entries ending at it then, and
        every change re-emits at once every window it alters, so those are
        today's minus the entry inserted at ``changed`` (``changed < j``), or
        with the removed one back at ``changed`` (``changed <= j``).  Trimming
        keeps every entry such a window reaches (``_trim_bucket``).
        """
        items, emitted = bucket.items, bucket.emitted
        w = self.window
        out: list[Item] = []
        for j in range(start, min(stop, len(items))):
            _, gt, trace, _ = items[j]
            old = emitted[j]
            if old:
                if removed is None:
                    before = items[max(0, j - w):changed] + items[changed + 1:j + 1]
                else:
                    before = items[max(0, j + 2 - w):changed] + [removed] + items[changed:j + 1]
                out.append((_window(before), gt, trace + (old,), True))
                self.replays += 1
            self.clock += 1
            mark: Any = self.clock << CHILD_BITS  # boxed once: the same int in the trace and in ``emitted``
            if w == 2:  # a reduce's window (the usual grouping): one tuple, built directly
                window: tuple[Any, ...] = (items[j - 1][0], items[j][0]) if j else (items[0][0],)
            else:
                window = _window_at(items, j, w)
            emitted[j] = mark
            out.append((window, gt, trace + (mark,), False))
        return out

    def snapshot(self, below: GlobalTime) -> list[tuple[Hashable, Entries]]:
        """The state a later tick needs from items with global time below ``below``: per key, the last
        ``window - 1`` of them (trimming at ``below`` would keep exactly those).

        Only valid once the min time reached ``below``: then no item below it
        can still arrive, so windows ending at those items never change again
        and what they emitted is not needed; items at or after ``below`` (in
        flight on this tick) are not part of it.
        """
        keep = self.window - 1
        out: list[tuple[Hashable, Entries]] = []
        if keep == 0:
            return out
        for key in list(self._frozen):
            self._bucket(key)
        for key, bucket in self.buckets.items():
            end = bisect_left(bucket.items, below, key=item_time)
            start = max(0, end - keep)
            if end > start:
                out.append((key, _entries(bucket, start, end)))
        return out

    def snapshot_changes(self, below: GlobalTime) -> list[tuple[Hashable, Entries]]:
        """``snapshot(below)`` for the keys that may have changed since the previous call (every key on the
        first): what a snapshot of each differs by, ``[]`` for a key it no longer holds.

        Why: a periodic snapshot of an inverted index visits every word each
        second on the event loop (0.1 s for 20k words) although a second of
        pages touches a few thousand; kept together with the previous
        snapshot's entries, this gives the same state for a fraction of it.
        A key nothing reached since the last call has the same entries
        below a later boundary: all of its items were below the earlier one,
        and trimming keeps the last ``window - 1`` of them.  A key with items
        at or after ``below`` (in flight when it was taken) is reported again
        next time.  Same precondition as ``snapshot``; besides, no trim may
        have passed ``below`` since the previous call.  A bucket restored
        lazily is not reported until something reaches it: its entries are
        those of the snapshot it came from.
        """
        changed, self._changed = self._changed, {}
        keep = self.window - 1
        if keep == 0:
            return []
        out: list[tuple[Hashable, Entries]] = []
        for key, bucket in changed.items():
            end = bisect_left(bucket.items, below, key=item_time)
            bucket.changed = end < len(bucket.items)  # items after the boundary: reported again next time
            if bucket.changed:
                self._changed[key] = bucket
            start = max(0, end - keep)
            out.append((key, _entries(bucket, start, end)))
        return out

    def restore(self, key: Hashable, entries: Entries) -> None:
        """Start bucket ``key`` from a snapshot's entries (a new tick, before any of its own items)."""
        self._check_new(key)
        bucket = self.buckets[key] = Bucket(key)
        self._fill(bucket, entries)
        if self.window > 1:
            bucket.changed = True
            self._changed[key] = bucket

    def restore_lazily(self, key: Hashable, thaw: Thaw) -> None:
        """Start bucket ``key`` from a snapshot's entries that ``thaw`` decodes when an item first reaches the key
        (or a whole ``snapshot`` is taken).

        Why: a restarted worker decoded its whole snapshot before it
        processed anything, and the inverted index's grows with the run (81 MB
        and 1.4 s over 5,000 pages: a node's share after 8 minutes at 20
        pages/s).  Most of it is never needed again, or not soon: the
        revisions of pages that do not come back, the posting lists of rare
        words.  Unlike ``restore``, the key is not reported by
        ``snapshot_changes`` until it changes: the caller's image of the last
        snapshot already holds it.
        """
        self._check_new(key)
        self._frozen[key] = thaw

    def _check_new(self, key: Hashable) -> None:
        if key in self.buckets or key in self._frozen:
            raise ValueError(f"bucket {key!r} restored twice or after items arrived")

    def trim(self, min_time: GlobalTime) -> None:
        """Forget what no future window can need once ``min_time`` has passed.

        Only buckets whose deadline passed are visited, so trimming costs what it
        drops.  Why buckets by deadline, and a heap of the deadlines: the items of
        one event (a line's words, a page's postings) share its global time, so
        a heap sifts once per event rather than once per key.  A key per heap
        entry paid a sift of tuple comparisons for every bucket trimmed while
        items were in flight (re-noted below, out of order): a third of trimming
        on the index, where every common word has a posting in flight (callgrind,
        the local runtime).  And the deque that held the in-order deadlines
        compared each key's with the min time; now one comparison per deadline.
        """
        times, deadlines = self._times, self._deadlines
        while times and times[0] < min_time:
            deadline = heapq.heappop(times)
            for bucket in deadlines.pop(deadline):
                self._trim_bucket(bucket, deadline, min_time)
        for key in list(self._pending_keys):
            found = self.buckets.get(key)
            if found is not None and found.pending:
                found.pending = {m for m in found.pending if m[0] >= min_time} or None
            if found is None or not found.pending:
                self._pending_keys.discard(key)
                if found is not None and not found.items:
                    self._delete(found)

    def _delete(self, bucket: Bucket) -> None:
        """Take an emptied bucket out of ``buckets`` (and ``_by_equivalence``); without a deadline, what still lists
        it skips it."""
        bucket.deadline = None
        del self.buckets[bucket.key]
        if self._by_equivalence:  # then every key is a pair (``accept_keyed``)
            key: Any = bucket.key
            if self._by_equivalence.get(key[1]) is bucket:
                del self._by_equivalence[key[1]]

    def _trim_bucket(self, bucket: Bucket, deadline: GlobalTime, min_time: GlobalTime) -> None:
        """Drop what ``bucket`` no longer needs, if ``deadline`` is still its own (not superseded by an earlier
        one handled already, nor taken away with the bucket).

        The items it keeps below the min time keep their marks: an item can
        only arrive at or after the min time, so it sorts after them, and the
        windows ending at them are never replaced again.  (Until the marks,
        the windows kept there held the payloads before them — a reduce's
        previous accumulator, a whole posting list on the inverted index —
        and were cleared here.)
        """
        if bucket.deadline != deadline:
            return
        keep = self.window - 1
        items = bucket.items
        n = len(items)
        below = n if n and items[-1][1] < min_time else 0  # all of them (in meta order): one comparison, not n
        if not below:
            while below < n and items[below][1] < min_time:  # a scan, not a bisect: it stops at the items it drops
                below += 1
        drop = below - keep
        if drop > 0:
            del items[:drop], bucket.emitted[:drop]
            self.held -= drop
        bucket.deadline = None
        if len(items) > keep:
            self._note_deadline(bucket)
        elif not items and not bucket.pending:
            self._delete(bucket)


def _window(items: list[Item]) -> tuple[Any, ...]:
    """The payloads of ``items``: the window they make."""
    return tuple([item[0] for item in items])


def _window_at(items: list[Item], j: int, window: int) -> tuple[Any, ...]:
    """The window ending at position ``j`` now: the payloads of up to ``window`` items up to it."""
    return _window(items[max(0, j - window + 1):j + 1])


def _entries(bucket: Bucket, start: int, stop: int) -> Entries:
    """The bucket's (meta, payload) pairs at positions ``start .. stop-1``.

    Why not ``list(zip(...))`` of two slices: a snapshot takes this for every
    key that changed in the last second, thousands on an inverted index, on
    the event loop; the slices and the zip were three more containers per key,
    and their allocations triggered young collections that were half of
    ``snapshot_changes``' time (perf, a worker of the index).
    """
    items = bucket.items
    return [(item_meta(items[j]), items[j][0]) for j in range(start, stop)]
