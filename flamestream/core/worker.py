"""Worker core: the whole graph over one hash range (paper §2.3), no I/O.

``process`` takes a batch of envelopes (destination operation, hash, item) and
runs them depth-first.  Items whose next operation's balancing function maps
into this worker's range are processed right here without a channel hop — the
local fast path, which also keeps a single worker's processing in meta order so
it replays nothing.  Everything else comes back in the outbox: envelopes per
remote worker and items for the barrier.  The imperative shell (local runtime
or gRPC service) moves them and does the acking.

Replicated entry (``plan.replicated``): when the source feeds a stateless
prefix, fronts send each input to *every* worker, with the input's entry hash
as its envelope hash.  Each worker runs the prefix over all inputs and keeps
only the items bound for its own hash range; the worker owning the entry hash
also emits what the prefix sends to sinks and its dead letters.  Each item is
still produced exactly once, with the same trace, but a grouping now receives
one front's items in global-time order, where before the words of a line split
on another worker raced the local ones and forced replays (word count under
load: replay overhead 16 -> 1).  The price is the prefix's CPU on every
worker (workers of one process share an entry map routed by hash:
``SharedPrefix``).  Inside the prefix, an envelope's hash being set on an
unbalanced operation is what marks it as such a copy.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Final

from flamestream.core.dead_letter import dead_letter
from flamestream.core.grouping import Entries, Grouping, StateError, Thaw
from flamestream.core.hashing import INT32_MAX, INT32_MIN, as_hash
from flamestream.core.item import Envelope, Item
from flamestream.core.limits import bounded_outputs
from flamestream.core.meta import GlobalTime, Trace
from flamestream.core.payload import check_payload
from flamestream.core.plan import BROADCAST, GROUPING, MAP, MERGE, SINK, Plan
from flamestream.core.tick import Layout

Outbox = tuple[dict[int, list[Envelope]], list[Item]]
WorkerState = dict[str, list[tuple[int, Hashable, Entries]]]
"""Grouping name -> (hash, bucket key, entries) of every bucket: what a tick hands the next one."""


def entry_hash(plan: Plan, payload: Any) -> int | None:
    """The entry hash of an event, or None if a front refuses it: a payload ``check_payload`` faults, or an
    entry balancing function that raises or returns no integer (``as_hash``).

    The local runtime, the oracle and Spark replay ask this, the front service
    the same two questions (to name the fault): so all agree on which events
    never entered the stream, and on where the others go.
    """
    if check_payload(payload) is not None:
        return None
    try:
        return as_hash(plan.entry_balance(payload))
    except Exception:  # business logic: anything can go wrong
        return None


def front_envelopes(plan: Plan, layout: Layout, inputs: list[tuple[int, Item]]) -> dict[int, list[Envelope]]:
    """Where a front sends stamped inputs, given as (entry hash, item): envelopes per worker.

    The owner of the entry hash (an int32: ``entry_hash``) gets each input, or
    every worker does when the entry is replicated.  The envelope carries the
    hash only where the entry uses it (balanced, or marking a replicated copy).
    """
    entry = plan.entry
    if plan.replicated:
        envelopes: list[Envelope] = [(entry, h, item) for h, item in inputs]
        return {worker: envelopes for worker in range(layout.workers)}
    per_worker: dict[int, list[Envelope]] = {}
    keep = plan.balances[entry] is not None
    for h, item in inputs:
        per_worker.setdefault(layout.owner(h), []).append((entry, h if keep else None, item))
    return per_worker


def merge_states(states: Iterable[WorkerState]) -> WorkerState:
    """One tick's complete state from its workers' snapshots (their keys never overlap: one owner each)."""
    merged: WorkerState = {}
    for state in states:
        for name, buckets in state.items():
            merged.setdefault(name, []).extend(buckets)
    return merged


EAGER_FANOUT: Final = 32
"""A fan-out that sends at least this many items to other workers hands them over at once (``Worker.run``)."""
_SINK: Final = 0
_LOCAL: Final = 1
_HASHED: Final = 2

_CHILDREN: Final[tuple[Trace, ...]] = tuple((i,) for i in range(256))
"""Typed as traces, not as one-int tuples: compiled, a ``tuple[int]`` is a C struct, and each read of one built a
new tuple from it (word count: a tuple a word in ``_child``)."""
_FIRST_CHILD: Final[Trace] = _CHILDREN[0]


def _child(i: int) -> Trace:
    """The trace mark of an operation's ``i``-th output (``LocalTime(0, i)``), prebuilt for the usual few: a map
    or broadcast marks every output, and building the one-int tuple was an allocation per item and hop."""
    return _CHILDREN[i] if i < 256 else (i,)


def _past_merges(plan: Plan) -> tuple[list[int], list[Trace]]:
    """Per operation, where an item sent to it really goes: past a run of unbalanced merges to the first other
    operation, and the trace marks those merges add (``()`` for an operation that is no such merge).

    Why: a merge passes its input on with one more trace mark, and nothing else.  Run as an operation, each
    item paid an envelope, a stack push and pop, a new item and a one-item list per merge; on word count and
    the inverted index every word and every accumulator goes through one (the loop of their reduce).  Sent
    past it with the same marks, the item is the one the merge would have made, so the same items with the same
    traces reach the same operations.  The order differs in one way: a map's outputs are routed together, as
    they always were when no merge came between, where the merge routed them one at a time, depth-first.  So
    a later output may leave for another worker before what an earlier one leads to, which a grouping there
    replays if both reach one bucket (``tests/test_merges.py``: the same graph without the merge sends the
    same, in the same order).  Routed one at a time (tried), the index's instructions were those of running
    the merge.
    """
    targets = list(range(len(plan.kinds)))
    marks: list[Trace] = [() for _ in plan.kinds]
    for op in range(len(plan.kinds)):
        dst, seen = op, set()
        while plan.kinds[dst] == MERGE and plan.balances[dst] is None and plan.routes[dst] and dst not in seen:
            seen.add(dst)
            dst = plan.routes[dst][0]
            marks[op] += _FIRST_CHILD
        if dst in seen:  # a cycle of merges only: leave it as it was (it never ends either way)
            dst, marks[op] = op, ()
        targets[op] = dst
    return targets, marks


class SharedPrefix:
    """What the entry map of a replicated prefix routed, per input: computed by the first of ``readers`` workers
    of one process that runs the input, taken by the others.

    Why: a replicated entry (module docstring) has every worker run the
    stateless prefix over every input, the price of handing each grouping one
    front's items in global-time order across processes.  Workers in one
    process (the local runtime) get the very same input from the front, so the
    first to run the entry map keeps all it routed — every output with its
    hash, and the dead letters of outputs whose balancing function failed —
    and each worker keeps its own range's share, as it would have.  On word
    count with 4 workers the split and every word's balancing function ran
    four times a line: most of what a 4-worker run spent beyond a 1-worker
    one (callgrind, ``bench/local.py``'s corpus).  The items are the same ones
    each worker would have built: the prefix is stateless, and payloads are
    never mutated (the rule that already lets the front hand every worker one
    item).  An input is held until its last reader took it: under lag, what
    is in flight between the fastest worker and the slowest.  Every worker
    given one must share (``Worker`` refuses it with a ``cut``), or the others'
    inputs stay held.
    """

    def __init__(self, readers: int) -> None:
        self.readers = readers
        self._kept: dict[tuple[GlobalTime, Trace], tuple[Any, bool, list[Envelope], list[Item], int]] = {}
        """(global time, trace) of an input -> (its payload, whether a tombstone, its routed outputs, its dead
        letters, readers yet to take them).  Keyed by meta, not by the item's identity: compiled code unpacks an
        item and builds the tuple anew.  The payload must be the very object (an input of another run with the
        same meta is not this one)."""

    def take(self, item: Item) -> tuple[list[Envelope], list[Item]] | None:
        """What another worker routed for ``item``, or None if this is the first to run it."""
        payload, gt, trace, tomb = item
        key = (gt, trace)
        kept = self._kept.get(key)
        if kept is None or kept[0] is not payload or kept[1] != tomb:
            return None
        _, _, routed, dead, left = kept
        if left > 1:
            self._kept[key] = (payload, tomb, routed, dead, left - 1)
        else:
            del self._kept[key]
        return routed, dead

    def keep(self, item: Item, routed: list[Envelope], dead: list[Item]) -> None:
        payload, gt, trace, tomb = item
        self._kept[(gt, trace)] = (payload, tomb, routed, dead, self.readers - 1)

    def __len__(self) -> int:
        """Inputs held for workers yet to take them (none once a run is over)."""
        return len(self._kept)


class Worker:
    def __init__(self, plan: Plan, index: int, layout: Layout, cut: frozenset[int] = frozenset(),
                 shared: SharedPrefix | None = None) -> None:
        """``cut``: groupings whose input is set aside in ``self.cut_off`` instead of processed — batch replay
        runs each grouping in a stage of its own, so its state lives in exactly one place.  ``shared``: the
        replicated prefix's work shared with the other workers of this process (``SharedPrefix``)."""
        if cut and shared is not None:
            raise ValueError("a worker with a cut does not share the replicated prefix: give it no SharedPrefix")
        self.plan = plan
        self.cut = cut
        self.cut_off: list[Envelope] = []
        self.index = index
        self.lo, self.hi = layout.range_of(index)
        self._starts = layout.starts
        """``layout.starts``, for ``Layout.owner``'s bisect done here: the method is interpreted (tick is not
        compiled), and a call into it cost more than the routing around it."""
        self._balances = plan.balances
        """Read once per routed output list: the plan is a plain dataclass, each attribute read a dict lookup."""
        self._fns, self._max_outputs, self._max_output_bytes = plan.fns, plan.max_outputs, plan.max_output_bytes
        """Read once per map call (``_mapped``), for the same reason."""
        self._first = [r[0] if r else -1 for r in plan.routes]
        """Each operation's first (for all but broadcast: only) downstream operation."""
        self._modes = [_SINK if kind == SINK else _LOCAL if plan.balances[i] is None else _HASHED
                       for i, kind in enumerate(plan.kinds)]
        """How items reach each operation: appended to the barrier list, pushed here, or routed by hash."""
        self._targets, self._marks = _past_merges(plan)
        self._suffixes = [[_child(i) + self._marks[dst] for i in range(256)]
                          if kind == MAP and dst >= 0 and self._marks[dst] else None
                          for kind, dst in zip(plan.kinds, self._first, strict=True)]
        """Per map whose outputs go into merges: output ``i``'s trace marks, its own and the merges' (for the
        usual few outputs), so each output is built once, where the merges are passed (``_past_merges``)."""
        self._fanouts = [[(_child(i) + self._marks[dst], self._targets[dst]) for i, dst in enumerate(routes)]
                         if kind == BROADCAST else [] for kind, routes in zip(plan.kinds, plan.routes, strict=True)]
        """Per broadcast: each copy's trace marks and where it goes, past the merges it feeds (a reduce's cycle
        takes one), so each copy is built once (as ``_suffixes`` for maps)."""
        self.groupings: dict[int, Grouping] = {
            i: Grouping(plan.windows[i]) for i, kind in enumerate(plan.kinds) if kind == GROUPING
        }
        self._by_name = {plan.names[op]: grouping for op, grouping in self.groupings.items()}
        entry = plan.entry
        self._shared = shared if shared is not None and shared.readers > 1 and (
            plan.replicated and plan.kinds[entry] == MAP
            and self._modes[self._targets[self._first[entry]]] == _HASHED) else None
        """Set only where it applies: the entry is a map whose outputs are routed by hash (word count's split),
        and other workers share it."""

    def process(self, envelopes: list[Envelope]) -> Outbox:
        """Run ``envelopes`` to completion; everything they produced in one outbox."""
        return next(self.run(envelopes))

    def run(self, envelopes: list[Envelope], flush: int | None = None) -> Iterator[Outbox]:
        """Run ``envelopes`` to completion, handing the outbox over whenever ``flush`` items are pending in it.

        Why pieces: a page of the inverted index fans out into thousands of
        postings.  Handed over at once, at the end, the other workers and the
        barrier idle until this worker is done and then work through its
        output after it, so the page's latency is the sum of everyone's work.
        Handed over as produced, they work alongside.  The last piece may be
        empty; without ``flush`` it is the only one.

        A piece also ends right after a fan-out that sent ``EAGER_FANOUT``
        items or more to other workers, however few are pending: a median page
        of the index (157 postings) never reached ``flush``, so the other worker
        got its half only after the owner had worked through its own, and the
        two halves ran one after the other.  Handed over at once they run side
        by side (p50 at 20 pages/s 12.6-13.6 -> 11.4-12.1 ms).  Smaller
        fan-outs (a few items per input) wait for ``flush`` as before: a
        message per input would cost more than it saves.
        """
        plan = self.plan
        kinds, names, balances = plan.kinds, plan.names, plan.balances
        equivalences, first, modes = plan.equivalences, self._first, self._modes
        groupings, entry, shared, fanouts = self.groupings, plan.entry, self._shared, self._fanouts
        remote: dict[int, list[Envelope]] = {}
        barrier: list[Item] = []
        sent = 0
        """Items in ``remote``."""
        stack = envelopes[::-1]
        lo, hi = self.lo, self.hi
        outs: list[Item] | None
        while stack:
            op, h, item = stack.pop()
            eager = False  # whether this item fanned out to other workers widely enough to hand the piece over now
            while True:  # an item, then its only output while that stays here (see the end of the loop)
                kind = kinds[op]
                nxt = first[op]
                payload, gt, trace, tomb = item
                copy = h is not None and balances[op] is None  # a replicated-prefix item (see module docstring)
                emits = not copy or lo <= h <= hi  # type: ignore[operator]
                try:
                    if kind == MAP and copy and op == entry and shared is not None:
                        kept = shared.take(item)
                        if kept is None:
                            kept = self._share(op, item, shared)
                        routed, dead = kept
                        mine = [envelope for envelope in routed if lo <= envelope[1] <= hi]  # type: ignore[operator]
                        if emits:
                            barrier.extend(dead)
                        mine.reverse()
                        stack.extend(mine)
                        break
                    if kind == MAP:
                        outs, nxt = self._mapped(op, item)
                    elif kind == GROUPING:
                        eq = equivalences[op]
                        outs = (groupings[op].accept(h, item) if eq is None
                                else groupings[op].accept_keyed(h, eq(payload), item))  # type: ignore[arg-type]
                    elif kind == MERGE:
                        outs = [(payload, gt, trace + _FIRST_CHILD, tomb)]
                    elif kind == BROADCAST:
                        outs = None
                    else:
                        if emits:
                            barrier.append(item)
                        break
                except StateError:
                    raise
                except Exception as exc:  # business logic failed: dead letter, never a dead worker
                    if emits:
                        barrier.append((dead_letter(names[op], exc, payload), gt, trace, tomb))
                    break
                if outs is not None and len(outs) == 1 and modes[nxt] == _LOCAL:
                    # Depth-first, the only output is what runs next anyway: go on with it here instead of a
                    # round trip through the stack (an envelope, a list and a push and pop saved per such hop).
                    op, h, item = nxt, h if copy else None, outs[0]
                    continue
                local: list[Envelope] = []
                if outs is None:  # broadcast: a copy per output
                    for marks, dst in fanouts[op]:
                        sent += self._deliver(dst, [(payload, gt, trace + marks, tomb)], h, local, remote, barrier,
                                              copy, emits, lo, hi)
                elif outs:  # every other operation has one downstream operation
                    fanned = self._route(nxt, outs, h, local, remote, barrier, copy, emits, lo, hi)
                    sent += fanned
                    eager = fanned >= EAGER_FANOUT
                if local:
                    local.reverse()
                    stack.extend(local)
                break
            if flush is not None and (sent + len(barrier) >= flush or eager) and stack:
                yield remote, barrier
                remote, barrier, sent = {}, [], 0
        yield remote, barrier

    def _share(self, op: int, item: Item, shared: SharedPrefix) -> tuple[list[Envelope], list[Item]]:
        """Run entry map ``op`` on ``item`` and route all of its outputs, whichever worker owns them, for
        ``shared`` to keep for the other workers.  A map that fails keeps nothing: every worker fails it alike
        (``run`` makes the dead letter)."""
        outs, nxt = self._mapped(op, item)
        routed: list[Envelope] = []
        dead: list[Item] = []
        self._route(nxt, outs, None, routed, {}, dead, True, True, INT32_MIN, INT32_MAX)
        shared.keep(item, routed, dead)
        return routed, dead

    def _mapped(self, op: int, item: Item) -> tuple[list[Item], int]:
        """Map ``op``'s outputs of ``item``, and the operation they go to.  Too many or too large outputs raise
        (``bounded_outputs``): the caller makes the dead letter."""
        payload, gt, trace, tomb = item
        fn: Any = self._fns[op]
        results = bounded_outputs(fn(payload), self._max_outputs, self._max_output_bytes)
        nxt = self._first[op]
        marks = self._suffixes[op]
        # By index, not ``enumerate``: compiled, that made an iterator and called it once per output and once more
        # (word count: 256 instructions a word, two map calls a word with one or no output each).
        n = len(results)
        if marks is not None and n <= 256:  # straight past the merges it feeds
            return [(results[i], gt, trace + marks[i], tomb) for i in range(n)], self._targets[nxt]
        return [(results[i], gt, trace + _child(i), tomb) for i in range(n)], nxt

    def _route(self, dst: int, outs: list[Item], h: int | None, local: list[Envelope],
               remote: dict[int, list[Envelope]], barrier: list[Item], copy: bool, emits: bool, lo: int,
               hi: int) -> int:
        """Send ``outs`` to ``dst``: the barrier, this worker's stack, or by hash; returns how many went remote.
        ``lo`` .. ``hi``: the hashes kept here (this worker's range; all of them for ``_share``)."""
        marks = self._marks[dst]
        if marks:  # into merges: past them at once (``_past_merges``)
            outs = [(p, gt, trace + marks, tomb) for p, gt, trace, tomb in outs]
            dst = self._targets[dst]
        return self._deliver(dst, outs, h, local, remote, barrier, copy, emits, lo, hi)

    def _deliver(self, dst: int, outs: list[Item], h: int | None, local: list[Envelope],
                 remote: dict[int, list[Envelope]], barrier: list[Item], copy: bool, emits: bool, lo: int,
                 hi: int) -> int:
        """``_route`` to an operation that is no merge to pass (one past them already)."""
        mode = self._modes[dst]
        if mode == _LOCAL:
            carried = h if copy else None
            boxed: list[Any] = outs  # as in ``_route_hashed``: the envelopes hold the items themselves
            local.extend([(dst, carried, out) for out in boxed])
        elif mode == _SINK:
            if emits:
                barrier.extend(outs)
        else:
            return self._route_hashed(dst, outs, local, remote, barrier, copy, emits, lo, hi)
        return 0

    def _route_hashed(self, dst: int, items: list[Item], local: list[Envelope], remote: dict[int, list[Envelope]],
                      barrier: list[Item], copy: bool, emits: bool, lo: int, hi: int) -> int:
        """Route ``items`` bound to ``dst`` by its balancing function: here, to a remote worker, or dead letter.

        A replicated-prefix ``copy`` keeps only what is local: the owner of the rest computes it itself.
        Returns how many went to remote workers.  The function's result goes through ``as_hash``, as in the
        oracle: a hash outside int32 would lie in no worker's range (a copy kept by none, ``Layout.owner``
        -1), and a result that is no integer (None, a str) is the item's failure — its dead letter, with the
        ack flowing on — not a TypeError that stops the worker.

        The items are read as ``Any``: compiled, an ``Item`` (a tuple of four typed fields) is a C struct, so an
        item read from a list as one was unpacked, and the envelope it went into built a new tuple of it; as
        ``Any`` it stays the object it is (a tuple an item and hop fewer).
        """
        sent = 0
        balance: Any = self._balances[dst]
        starts = self._starts
        smallest, largest = INT32_MIN, INT32_MAX
        boxed: list[Any] = items  # items read as ``Any`` stay the objects they are (see the docstring)
        for item in boxed:
            try:
                h = balance(item[0])
                if type(h) is not int or not smallest <= h <= largest:  # the common case costs two checks
                    h = as_hash(h)  # folded into int32, or BalanceError: the same everywhere (see as_hash)
            except Exception as exc:
                if emits:
                    barrier.append((dead_letter(self.plan.names[dst], exc, item[0]), item[1], item[2], item[3]))
                continue
            if self.cut and dst in self.cut:
                self.cut_off.append((dst, h, item))
            elif lo <= h <= hi:
                local.append((dst, h, item))
            elif not copy:
                remote.setdefault(bisect_right(starts, h) - 1, []).append((dst, h, item))  # Layout.owner
                sent += 1
        return sent

    def snapshot(self, below: GlobalTime) -> WorkerState:
        """The state of every grouping restricted to items below ``below``, by grouping name (see
        ``Grouping.snapshot``), each key with its hash so another layout can find its owner."""
        return self._state(lambda grouping: grouping.snapshot(below))

    def snapshot_changes(self, below: GlobalTime) -> WorkerState:
        """What ``snapshot(below)`` differs by from the previous call's state (see ``Grouping.snapshot_changes``:
        a key with no entries left is reported with ``[]``); every grouping is named, changed or not."""
        return self._state(lambda grouping: grouping.snapshot_changes(below))

    def _state(self, buckets_of: Callable[[Grouping], list[tuple[Hashable, Entries]]]) -> WorkerState:
        state: WorkerState = {}
        for op, grouping in self.groupings.items():
            keyed = self.plan.equivalences[op] is not None  # the key is (hash, equivalence key), else the hash
            buckets: list[tuple[int, Hashable, Entries]] = []
            for key, entries in buckets_of(grouping):
                h: Any = key[0] if keyed else key  # type: ignore[index]
                buckets.append((h, key, entries))
            state[self.plan.names[op]] = buckets
        return state

    def restore(self, state: WorkerState) -> None:
        """Take over the keys of ``state`` (merged snapshots of a previous tick) that this worker's range owns.

        Groupings are matched by name; a grouping the state does not mention
        starts empty, and state of groupings this graph lacks is ignored
        (deploy refuses to drop it unless asked to).
        """
        for name, keys in state.items():
            for h, key, entries in keys:
                grouping = self._taker(name, h)
                if grouping is not None:
                    grouping.restore(key, entries)

    def restore_lazily(self, name: str, h: int, key: Hashable, thaw: Thaw) -> bool:
        """``restore`` of one bucket whose entries ``thaw`` decodes when first needed (``Grouping.restore_lazily``);
        whether this worker took it."""
        grouping = self._taker(name, h)
        if grouping is None:
            return False
        grouping.restore_lazily(key, thaw)
        return True

    def _taker(self, name: str, h: int) -> Grouping | None:
        """The grouping that takes over a bucket of grouping ``name`` with hash ``h``: None unless this graph has
        the grouping and this worker's range owns the hash."""
        grouping = self._by_name.get(name)
        return grouping if grouping is not None and self.lo <= h <= self.hi else None

    def on_min_time(self, min_time: GlobalTime) -> None:
        """The acker's minimal time moved: trim grouping state."""
        for grouping in self.groupings.values():
            grouping.trim(min_time)

    @property
    def replays(self) -> int:
        return sum(g.replays for g in self.groupings.values())

    def state_size(self) -> int:
        return sum(g.held for g in self.groupings.values())
