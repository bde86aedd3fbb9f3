"""Spark Structured Streaming (``local[2]``): the same computation as micro-batches, written as a Spark user would.

Input is Spark's file source: each batch the pacer hands over becomes one
JSON-lines file, staged outside the watched directory and renamed in, so a
listing never sees half a file.  Every event carries a sequence number in push
order, which is what lets the inverted index's stateful step apply a
micro-batch's pages to a word in push order.

The trigger is ``processingTime=0``: the next micro-batch starts as soon as the
previous one ended and a listing found new files, the lowest latency the file
source offers.  Every micro-batch pays a fixed cost (listing, planning, a
state-store commit, the checkpoint's offset and commit logs) however few
events it holds, which is the point of the comparison.  The query is warmed
up on a throw-away copy first, so the run measures streaming, not JVM start-up.

Output is a ``foreachBatch`` sink: each micro-batch's rows are collected once,
written to ``out/batch-<id>.jsonl`` by an atomic rename (a replayed batch id
rewrites the same rows over the same file), then handed to the tracker.  With
the checkpoint that makes the output exactly-once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pyspark
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from examples import inverted_index
from flamestream.bench.harness import Pacer, RunSpec, Tracker
from flamestream.bench.workloads import Record, Workload

TRIGGER = "0 seconds"
MAX_LISTED_PATHS = 1_000_000
WARM_UP_BATCHES = 15


def _wordcount(lines: DataFrame) -> DataFrame:
    """``split_words`` in the JVM: ``(?U)`` makes Java's ``\\w`` Unicode-aware like Python's.

    Keeping the split in the JVM is how a Spark user would write it.  The two
    still differ at the edges (Java counts combining marks as word characters,
    Python does not); the benchmark's words are plain ASCII, and the oracle
    check would catch any difference.
    """
    words = F.explode(F.regexp_extract_all(F.lower("line"), F.lit(r"(?U)(\w+)"), 1))
    return lines.select(words.alias("word")).groupBy("word").count()


def _postings(pid: str, title: str, text: str) -> list[tuple[str, list[int]]]:
    """The example's own ``positions``, so the words match ours exactly (stress marks, title first)."""
    return [(w, list(p)) for w, p in inverted_index.positions({"id": pid, "title": title, "text": text}).items()]


def _index(key: tuple[str], postings: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    """One word's postings of a micro-batch, in push order: one changelog record per page.

    The state is the number of pages holding the word; benchmark page ids are
    always fresh, so each posting adds a page and ``pages`` is a running count.
    Called once per word and micro-batch, so it sticks to numpy: pandas'
    ``sort_values`` and ``concat`` of a single frame would double its cost.
    """
    frames = list(postings)
    batch = frames[0] if len(frames) == 1 else pd.concat(frames)
    order = batch["seq"].to_numpy().argsort()
    (seen,) = state.getOption or (0,)
    state.update((seen + len(order),))
    yield pd.DataFrame({"word": key[0], "page": batch["page"].to_numpy()[order],
                        "positions": batch["positions"].to_numpy()[order],
                        "pages": range(seen + 1, seen + 1 + len(order))})


def _inverted_index(pages: DataFrame) -> DataFrame:
    """Pages -> (word, page, positions, seq) -> per-word state, one record per (word, page) as our changelog.

    A plain aggregation would fold a micro-batch's pages of a word into one
    row; the changelog needs each page's own running count.  The Arrow UDF
    ships rows to Python in batches rather than pickling them one by one.
    """
    postings = F.udf(_postings, "array<struct<word: string, positions: array<int>>>", useArrow=True)
    exploded = pages.select("seq", F.col("id").alias("page"),
                            F.explode(postings("id", "title", "text")).alias("posting"))
    return (exploded.select("posting.word", "page", "posting.positions", "seq").groupBy("word")
            .applyInPandasWithState(_index, "word string, page string, positions array<int>, pages long",
                                    "pages long", "update", GroupStateTimeout.NoTimeout))


@dataclass(frozen=True)
class _Plan:
    schema: str
    """The input files' explicit schema (no inference on a stream)."""
    row: Callable[[int, Any], dict[str, Any]]
    """(sequence number, payload) -> the event's JSON object."""
    query: Callable[[DataFrame], DataFrame]
    check_method: str
    """``final-state`` when Spark folds a micro-batch's updates of a key into one record."""
    warm_up_events: int
    """Events per warm-up micro-batch: enough to exercise every operator, few enough to keep set-up short."""


PLANS = {
    "wordcount": _Plan("seq BIGINT, line STRING", lambda seq, line: {"seq": seq, "line": line},
                       _wordcount, "final-state", 10),
    "inverted-index": _Plan("seq BIGINT, id STRING, title STRING, text STRING", lambda seq, page: {"seq": seq, **page},
                            _inverted_index, "changelog", 2),
}


def _collect_only(rows: DataFrame, _batch_id: int) -> None:
    rows.collect()


class _Inbox:
    """The directory a file source watches, fed one whole file per pushed batch."""

    def __init__(self, root: Path, plan: _Plan) -> None:
        self.dir, self._staging = root / "in", root / "staging"
        self.dir.mkdir(parents=True)
        self._staging.mkdir()
        self._plan = plan
        self._files = self._seq = 0

    def push(self, batch: list[tuple[str, Any]]) -> None:
        lines = []
        for _event_id, payload in batch:
            lines.append(json.dumps(self._plan.row(self._seq, payload), ensure_ascii=False) + "\n")
            self._seq += 1
        staged = self._staging / f"{self._files:08d}.jsonl"
        staged.write_text("".join(lines), encoding="utf-8")
        os.rename(staged, self.dir / staged.name)
        self._files += 1


class SparkStructuredStreaming:
    guarantees = "exactly-once"
    check_method = "changelog"
    """Replaced per workload in ``setup``."""

    def setup(self, spec: RunSpec, workload: Workload) -> None:
        self._spec = spec
        self._plan = PLANS[workload.name]
        self.check_method = self._plan.check_method
        self._out = spec.workdir / "out"
        self._out.mkdir(parents=True)
        self.micro_batches = 0
        # A session already running in this process (the tests' shared one) is reused, never stopped.
        # Not replay.spark_session(): that one leaves the console progress bar on.
        self._owns_context = SparkContext._active_spark_context is None
        self._spark = (SparkSession.builder.master("local[2]").appName("flamestream-bench")
                       .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                       .config("spark.log.level", "ERROR").getOrCreate().newSession())
        # newSession(): these stay out of a shared session's SQL conf.  Above the threshold (32 paths) the
        # file source lists a micro-batch's new files with a Spark job of one task per file.
        self._spark.conf.set("spark.sql.shuffle.partitions", str(spec.workers))
        self._spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.threshold", str(MAX_LISTED_PATHS))
        self._warm_up(workload, spec.workdir / "warm-up")
        self._inbox = _Inbox(spec.workdir, self._plan)
        self._query = self._start(self._inbox, spec.workdir / "checkpoint", self._sink)

    def _warm_up(self, workload: Workload, root: Path) -> None:
        """Run a throw-away copy of the query first, so the measured one starts with a JIT-compiled JVM.

        A cold first micro-batch of a few events takes ~10 s here (class loading,
        JIT, code generation, Python workers), and everything pushed meanwhile
        queues behind it: the run would measure start-up, not streaming.
        """
        events = workload.events(self._spec.seed + 1)
        inbox = _Inbox(root, self._plan)
        query = self._start(inbox, root / "checkpoint", _collect_only)
        for _ in range(WARM_UP_BATCHES):
            inbox.push([next(events) for _ in range(self._plan.warm_up_events)])
            query.processAllAvailable()
        query.stop()

    def _start(self, inbox: _Inbox, checkpoint: Path, sink: Callable[[DataFrame, int], None]) -> StreamingQuery:
        events = self._spark.readStream.schema(self._plan.schema).json(str(inbox.dir))
        return (self._plan.query(events).writeStream.outputMode("update").foreachBatch(sink)
                .option("checkpointLocation", str(checkpoint)).trigger(processingTime=TRIGGER).start())

    def _sink(self, rows: DataFrame, batch_id: int) -> None:
        records: list[Record] = [row.asDict(recursive=True) for row in rows.collect()]
        target = self._out / f"batch-{batch_id}.jsonl"
        staged = self._out / f".{target.name}"
        staged.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        os.replace(staged, target)
        self.micro_batches += 1
        self._tracker.observe(records)

    def run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        self._tracker = tracker
        for batch in pacer.batches():
            self._inbox.push(batch)
        self._drain(tracker)
        self._query.stop()
        return {"version": f"Spark {pyspark.__version__}", "trigger": f"processingTime={TRIGGER}",
                "micro_batches": self.micro_batches}

    def _drain(self, tracker: Tracker) -> None:
        """``wait_all`` up to the drain timeout, but raise at once if the query died instead of waiting it out."""
        deadline = time.monotonic() + self._spec.drain_timeout
        while not tracker.wait_all(min(0.2, max(0.0, deadline - time.monotonic()))):
            if (error := self._query.exception()) is not None:
                raise error
            if not self._query.isActive:  # a fatal JVM error (e.g. StackOverflowError) can end it with no exception
                raise RuntimeError("the Spark streaming query stopped; its JVM error is on stderr")
            if time.monotonic() >= deadline:
                return

    def close(self) -> None:
        self._query.stop()
        if self._owns_context:
            self._spark.stop()
