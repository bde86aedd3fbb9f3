"""Embedded local runtime: the whole system in one process, deterministically.

N workers (hash ranges), F fronts, one acker and a barrier — the same core
classes the services wrap — connected by FIFO channels that a seeded scheduler
drains in a random interleaving.  Fronts race each other and worker-to-worker
channels overtake one another, so groupings see items out of order and
replay, exactly as on a real network; the output must still equal the oracle's.

A worker step drains its input channels as one queue ordered by meta (the
paper's prioritized queues): every batch queued on each channel it takes, as a
worker service takes its whole inbox.  Taking only each channel's head batch
cost a step per batch: a 4-worker word count ran twice the steps, each with its
fixed costs, and at its peak held 1.4 times as many items in its groupings
(``bench/local.py``: 0.45 of the oracle's throughput then, 0.68 since; the
inverted index on 4 workers replays more and runs slower, README).  Slow
channels still miss steps, and a lagging channel, once taken, hands over all it
holds at once.  Like a worker service, a step ships its output in pieces as the
core produces them (``Worker.run`` with a seeded flush size of 1 to 256 items),
and the scheduler may run other workers and the barrier between pieces; the
step's receipt acks go last.  With ``adversarial=True`` every channel gets a
speed drawn over three orders of magnitude and slow channels keep missing
steps, so some paths lag far behind and replays/retractions pile up.
One thing differs from separate processes: a replicated entry map routed by
hash runs once per input for all workers, not once per worker
(``SharedPrefix``).  The output is the same; the map's function is called
fewer times, and an input's outputs are held until the slowest worker took them.
"""

from __future__ import annotations

import gc
import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from flamestream.core.acker import AckTable
from flamestream.core.barrier import BarrierBuffer, Released
from flamestream.core.front import Stamped, stamp_inputs
from flamestream.core.graph import Graph
from flamestream.core.grouping import Entries, Thaw
from flamestream.core.item import Item, envelope_meta, envelope_time, item_meta, item_time
from flamestream.core.meta import MAX_TIME, GlobalTime
from flamestream.core.plan import Plan, compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Outbox, SharedPrefix, Worker, WorkerState, entry_hash, front_envelopes, merge_states

Channel = tuple[str, int, int]
"""("front", front, worker) | ("worker", src, dst) | ("barrier", worker, 0)."""

Batch = tuple[list[Any], dict[GlobalTime, int]]
"""(envelopes or items, ack value per global time in the batch)."""


@dataclass
class RunStats:
    reached_barrier: int = 0
    retractions: int = 0
    released: int = 0
    replays: int = 0
    steps: int = 0
    peak_state: int = 0
    """Largest number of items held by all groupings after a trim (grows with items in flight)."""
    final_state: int = 0
    """Items the groupings still hold once everything is released: window-1 per bucket at most."""

    @property
    def replay_overhead(self) -> float:
        """Items reaching the barrier per item released (1.0 = no wasted work)."""
        return self.reached_barrier / self.released if self.released else 1.0


@dataclass(frozen=True)
class Handover:
    """A new tick from global time ``at`` on: ``graph`` (None: the same one) on ``workers`` hash ranges.

    Fronts hold events at or after ``at`` until the min time reaches it; then
    the workers' snapshots below ``at`` are merged and every new worker
    takes the keys its range owns — the hand-over the cluster performs.
    """

    at: GlobalTime
    workers: int
    graph: Graph | None = None


@dataclass
class RunResult:
    output: list[Released]
    rejected: list[Any] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    handed_over: list[tuple[GlobalTime, WorkerState]] = field(default_factory=list)
    """The merged state each hand-over carried, at its boundary."""


YOUNG_EVERY: Final = 1 << 16
"""Scheduler steps between collections of the youngest generation while a run pauses the collector.

Why pause it: a run allocates a tuple or two per item and hop (items, metas,
traces), and the collector's automatic passes over them were 10-15 % of the
runtime's CPU on word count (perf, bench/local.py) while finding nothing: the
runtime's own objects form no cycles and are freed by reference counting.
Cycles that business logic makes are still found — by this pass, and by the
collector's own once the run ends — so memory stays bounded.  Why not more
often: each pass walks every object allocated since the previous one that is
still alive (about 100,000 on word count: released records, grouping state,
items in flight), so a pass every 2**14 steps took 0.58-0.73 s of a 4-worker
run of 100,000 words (gc.callbacks); every 2**16, 0.26-0.32 s."""


def _below(rng: random.Random, n: int) -> int:
    """A uniform choice in ``range(n)`` from one C-level ``random()`` call: ``Random.choice`` and ``randint`` run
    several Python-level calls each, a tenth of the whole local runtime's time on word count (bench/local.py).
    The bias (n / 2**53) does not matter to a scheduler."""
    return int(rng.random() * n)


class LocalRuntime:
    def __init__(self, graph: Graph, workers: int = 1, fronts: int = 1, seed: int = 0, per_ms: int = 1,
                 batch: int = 1, adversarial: bool = False, handovers: Iterable[Handover] = ()) -> None:
        """``batch`` bounds how many events a front injects in one step (drawn uniformly from 1..batch):
        bursts put more items in flight at once and so cause more out-of-order arrivals and replays.
        ``handovers``: ticks that follow the first one (see ``Handover``)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.handovers = sorted(handovers, key=lambda h: h.at)
        self.plan = compile_graph(graph)
        self.layout = Layout.even(workers)
        self.fronts = fronts
        self.per_ms = per_ms
        self.batch = batch
        self.adversarial = adversarial
        self.rng = random.Random(seed)

    def run(self, payloads: Iterable[Any]) -> RunResult:
        return self.run_stamped(stamp_inputs(list(payloads), self.fronts, self.per_ms))

    def run_stamped(self, stamped: list[Stamped]) -> RunResult:
        """Run ``stamped`` events to completion, with the cyclic garbage collector paused (see ``YOUNG_EVERY``)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run_stamped(stamped)
        finally:
            if enabled:
                gc.enable()

    def _run_stamped(self, stamped: list[Stamped]) -> RunResult:
        rng = self.rng
        plan, layout = self.plan, self.layout
        handovers = deque(self.handovers)
        workers = _workers(plan, layout)
        acker = AckTable(range(self.fronts))
        barrier = BarrierBuffer()
        result = RunResult(output=[])
        stats = result.stats
        pending: list[deque[Stamped]] = [deque() for _ in range(self.fronts)]
        for s in stamped:
            pending[s[0]].append(s)
        channels: dict[Channel, deque[Batch]] = {}
        speed: dict[Channel, float] = {}
        inbound: dict[int, dict[Channel, None]] = {}
        """Worker (or ``-1 - worker`` for the barrier's channel from it) -> its channels holding batches, kept as
        batches come and go: collecting them from every channel at every scheduler step was a tenth of a
        4-worker run (callgrind, word count)."""
        steps: dict[int, tuple[Outbox, Iterator[Outbox], list[Batch]]] = {}
        """Worker -> its step under way: the next piece to deliver, the core's later pieces (computed one ahead,
        so the last piece and the step's receipt acks go in one scheduler turn) and the batches it took."""

        def advance(worker: int, piece: Outbox, pieces: Iterator[Outbox], batches: list[Batch]) -> None:
            deliver(worker, *piece)
            following = next(pieces, None)
            if following is not None:
                steps[worker] = (following, pieces, batches)
                return
            steps.pop(worker, None)
            ack_receipts(batches)

        def ack_receipts(batches: list[Batch]) -> None:
            for _, acks in batches:
                for gt, r in acks.items():
                    acker.ack(gt, r)

        def send(channel: Channel, entries: list[Any], gt_of: Any) -> None:
            acks = dict.fromkeys(map(gt_of, entries), 0)  # one ack per global time: a line's words share one
            for gt in acks:
                acks[gt] = r = rng.getrandbits(64)
                acker.ack(gt, r)
            queue = channels.get(channel)
            if queue is None:
                queue = channels[channel] = deque()
                speed[channel] = 10 ** rng.uniform(-3, 0) if self.adversarial else 1.0
            if not queue:
                inbound.setdefault(-1 - channel[1] if channel[0] == "barrier" else channel[2], {})[channel] = None
            queue.append((entries, acks))

        def take(destination: int, channel: Channel) -> list[Batch]:
            queue = channels[channel]
            batches = list(queue)
            queue.clear()
            ready = inbound[destination]
            del ready[channel]
            if not ready:
                del inbound[destination]
            return batches

        def deliver(worker: int, remote: dict[int, list[Any]], to_barrier: list[Any]) -> None:
            for dst, envs in remote.items():
                send(("worker", worker, dst), envs, envelope_time)
            if to_barrier:
                send(("barrier", worker, 0), to_barrier, item_time)

        released_to = acker.min_time()
        fronts_left = [f for f in range(self.fronts) if pending[f]]
        for f in range(self.fronts):
            # A front promises nothing older than its first event: a hand-over waits for every front's promise.
            acker.report(f, pending[f][0][1].ts if pending[f] else MAX_TIME.ts)

        def open_front(front: int) -> bool:
            """Whether the front may inject now: before a hand-over only events of the current tick."""
            return not handovers or pending[front][0][1] < handovers[0].at

        while True:
            while handovers and acker.min_time() >= handovers[0].at:
                # Everything below the boundary is done: the next tick starts from the merged snapshots.
                handover = handovers.popleft()
                state = merge_states([worker.snapshot(handover.at) for worker in workers])
                result.handed_over.append((handover.at, state))
                stats.replays += sum(w.replays for w in workers)
                plan = compile_graph(handover.graph) if handover.graph is not None else plan
                layout = Layout.even(handover.workers)
                workers = _workers(plan, layout)
                for worker in workers:
                    _take_over(worker, state)
            candidates: list[Any] = [("front", f) for f in fronts_left if open_front(f)]
            candidates.extend(inbound)
            candidates.extend(w for w in steps if w not in inbound)
            if not candidates:
                break
            choice = candidates[_below(rng, len(candidates))]
            stats.steps += 1
            if not stats.steps % YOUNG_EVERY:
                gc.collect(0)
            if isinstance(choice, tuple):
                front = choice[1]
                queue = pending[front]
                inputs: list[tuple[int, Item]] = []
                for _ in range(min(len(queue), 1 + _below(rng, self.batch))):
                    if not open_front(front):
                        break
                    _f, gt, trace, payload = queue.popleft()
                    h = entry_hash(plan, payload)  # what the front service refuses, refused here too
                    if h is None:
                        result.rejected.append(payload)
                    else:
                        inputs.append((h, (payload, gt, trace, False)))
                for w, envs in front_envelopes(plan, layout, inputs).items():
                    send(("front", front, w), envs, envelope_time)
                if queue:
                    acker.report(front, queue[0][1].ts)
                else:
                    acker.report(front, MAX_TIME.ts)
                    fronts_left.remove(front)
            elif choice in steps:
                advance(choice, *steps[choice])
            else:
                # A worker (or barrier) drains what its input channels hold as one prioritized queue; slow
                # channels may miss the step, which is what reorders items across channels.
                ready = list(inbound[choice])
                taken = [c for c in ready if rng.random() < speed[c]]
                if not taken:
                    taken = rng.choices(ready, [speed[c] for c in ready])
                batches = [batch for c in taken for batch in take(choice, c)]
                entries = [e for batch, _ in batches for e in batch]
                if len(batches) > 1:
                    entries.sort(key=item_meta if choice < 0 else envelope_meta)
                if choice >= 0:
                    pieces = workers[choice].run(entries, 1 << _below(rng, 9))
                    advance(choice, next(pieces), pieces, batches)
                else:
                    for item in entries:
                        barrier.insert(item)
                    ack_receipts(batches)
            min_time = acker.min_time()
            if min_time > released_to:
                released_to = min_time
                result.output.extend(barrier.release(min_time))
                for worker in workers:
                    worker.on_min_time(min_time)
                stats.peak_state = max(stats.peak_state, sum(worker.state_size() for worker in workers))
        if acker.in_flight() or len(barrier) or handovers:
            raise AssertionError(f"run ended with {acker.in_flight()} global times in flight, {len(barrier)} held, "
                                 f"{len(handovers)} hand-overs not reached")
        stats.reached_barrier = barrier.received
        stats.retractions = barrier.retractions
        stats.released = len(result.output)
        stats.replays += sum(w.replays for w in workers)
        stats.final_state = sum(w.state_size() for w in workers)
        return result


def _workers(plan: Plan, layout: Layout) -> list[Worker]:
    """A tick's workers, sharing the replicated prefix's work: they run in one process (``SharedPrefix``)."""
    shared = SharedPrefix(layout.workers)
    return [Worker(plan, i, layout, shared=shared) for i in range(layout.workers)]


def _take_over(worker: Worker, state: WorkerState) -> None:
    """A hand-over's state restored the way a cluster's worker restores a snapshot file's (lazily), so that the
    runtime-vs-oracle tests of hand-overs check that path too; here the entries are decoded already."""
    for name, buckets in state.items():
        for h, key, entries in buckets:
            worker.restore_lazily(name, h, key, _given(entries))


def _given(entries: Entries) -> Thaw:
    return lambda: entries
