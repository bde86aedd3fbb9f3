"""Bytewax 0.21: the same computation as a Timely-based Python dataflow, run in this process.

The dataflow is ``input -> flat_map (keyed by word) -> stateful_map -> output``:
the stateful step keeps each word's running count, so it emits one record per
update in exactly the shape our system does and is checked as a changelog.

The source is one partition draining a queue the benchmark's pusher fills, so
lines or pages enter in push order; with several workers the keyed step is
shuffled by word, and a word's updates stay in order because one worker owns
the word and receives them over one FIFO channel from the source's worker.
No recovery is configured (Bytewax recovery would give at-least-once output),
so the run promises nothing across failures.

The workers are threads of this process (``workers_per_process``), sharing
the GIL with each other and with the pusher.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.run import cli_main

from examples import inverted_index, wordcount
from flamestream.bench.harness import Pacer, RunSpec, Tracker
from flamestream.bench.workloads import Record, Workload

_END = None
"""Queued after the last batch, once every event is done: the source then ends the flow."""

Keyed = tuple[str, Any]
Pushed = queue.SimpleQueue[list[tuple[str, Any]] | None]
"""The pacer's batches of (event id, payload), then ``_END``."""
Observe = Callable[[list[Record]], None]


def _words(line: str) -> list[Keyed]:
    return [(word, word) for word in wordcount.split_words(line)]


def _count(count: int | None, word: str) -> tuple[int, Record]:
    count = (count or 0) + 1
    return count, {"word": word, "count": count}


def _postings(page: dict[str, str]) -> list[Keyed]:
    pid = page["id"]
    return [(word, (word, pid, where)) for word, where in inverted_index.positions(page).items()]


def _index(pages: int | None, posting: tuple[str, str, tuple[int, ...]]) -> tuple[int, Record]:
    """The word's page count is a running count because benchmark page ids are always fresh."""
    word, pid, where = posting
    pages = (pages or 0) + 1
    return pages, {"word": word, "page": pid, "positions": list(where), "pages": pages}


STEPS: dict[str, tuple[Callable[[Any], list[Keyed]], Callable[[Any, Any], tuple[int, Record]]]] = {
    "wordcount": (_words, _count),
    "inverted-index": (_postings, _index),
}
"""Workload -> (event to (word, value) pairs, the word's state update emitting one record)."""


class _QueuePartition(StatefulSourcePartition[Any, None]):
    """Hands over whatever was pushed since the last poll, never blocking the worker.

    When empty, Bytewax's default ``next_awake`` (None) polls again after a
    millisecond, so an idle source does not spin.
    """

    def __init__(self, pushed: Pushed) -> None:
        self._pushed = pushed
        self._ended = False

    def next_batch(self) -> list[Any]:
        if self._ended:
            raise StopIteration
        out: list[Any] = []
        while True:
            try:
                batch = self._pushed.get_nowait()
            except queue.Empty:
                return out
            if batch is _END:
                self._ended = True
                return out
            out.extend(payload for _event_id, payload in batch)

    def snapshot(self) -> None:
        return None


class _QueueSource(FixedPartitionedSource[Any, None]):
    """One partition, so a single worker reads the queue and events enter in push order."""

    def __init__(self, pushed: Pushed) -> None:
        self._pushed = pushed

    def list_parts(self) -> list[str]:
        return ["pushed"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _QueuePartition:
        return _QueuePartition(self._pushed)


class _TrackerPartition(StatelessSinkPartition[Keyed]):
    def __init__(self, observe: Observe) -> None:
        self._observe = observe

    def write_batch(self, items: list[Keyed]) -> None:
        self._observe([record for _word, record in items])


class _TrackerSink(DynamicSink[Keyed]):
    """Every worker hands the records its keys produced straight to the (thread-safe) tracker."""

    def __init__(self, observe: Observe) -> None:
        self._observe = observe

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _TrackerPartition:
        return _TrackerPartition(self._observe)


class Bytewax:
    """Runs the dataflow on a background thread so the caller's thread stays the single, paced pusher.

    ``cli_main`` runs fine off the main thread, so ``spec.workers`` Timely
    workers run as in a real single-process deployment (``run_main`` would
    allow only one).
    """

    guarantees = "none"
    check_method = "changelog"

    def setup(self, spec: RunSpec, workload: Workload) -> None:
        self._workers = spec.workers
        self._drain_timeout = spec.drain_timeout
        self._pushed: Pushed = queue.SimpleQueue()
        self._tracker: Tracker | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        split, update = STEPS[workload.name]
        self._flow = Dataflow(f"bench_{workload.name.replace('-', '_')}")
        events = op.input("pushed", self._flow, _QueueSource(self._pushed))
        keyed = op.flat_map("by_word", events, split)
        records = op.stateful_map("update", keyed, update)
        op.output("tracker", records, _TrackerSink(self._observe))

    def _observe(self, records: list[Record]) -> None:
        assert self._tracker is not None, "records before run()"
        self._tracker.observe(records)

    def _execute(self) -> None:
        try:
            cli_main(self._flow, workers_per_process=self._workers)  # type: ignore[no-untyped-call]
        except BaseException as exc:  # re-raised by run() in the caller's thread
            self._failure = exc

    def run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        self._tracker = tracker
        self._thread = threading.Thread(target=self._execute, name="bytewax", daemon=True)
        self._thread.start()
        for batch in pacer.batches():
            self._pushed.put(batch)
        tracker.wait_all(self._drain_timeout)
        self._stop()
        if self._failure is not None:
            raise RuntimeError("the Bytewax dataflow failed") from self._failure
        return {"version": f"Bytewax {version('bytewax')}"}

    def _stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._pushed.put(_END)
            self._thread.join()

    def close(self) -> None:
        self._stop()
