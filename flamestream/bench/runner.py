"""One system, one workload, one rate, in this process: ``python -m flamestream.bench.runner SPEC.json OUT.json``.

The orchestrator starts one runner process per (system, rate) so each
system's CPU seconds and peak RSS are its own and a peer's leftovers (a JVM,
Bytewax threads) never slow the next.  The runner writes the system's entry
(figures, the oracle check and the raw latencies) to ``OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flamestream.bench.harness import Pacer, RunSpec, Tracker, TreeMeter
from flamestream.bench.systems import load
from flamestream.bench.workloads import workload as load_workload
from flamestream.runtime.heap import tune_gc


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))]


def latency_figures(latencies_s: list[float]) -> dict[str, float | None]:
    ordered = sorted(latencies_s)
    if not ordered:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    return {"p50_ms": round(percentile(ordered, 0.50) * 1000, 2), "p90_ms": round(percentile(ordered, 0.90) * 1000, 2),
            "p99_ms": round(percentile(ordered, 0.99) * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(sum(ordered) / len(ordered) * 1000, 2)}


LARGE_SHARE = 0.05
"""The share of events, the largest by their obligations, that ``head_of_line`` calls large."""


def head_of_line(completions: list[tuple[float, float, int]], share: float = LARGE_SHARE) -> dict[str, Any]:
    """The latencies (ms) of ``completions`` — (scheduled time, latency s, obligations) — split three ways: the
    largest ``share`` of events by obligations, the others that became due while a large one was unfinished, and
    the others.  ``large_units``: the fewest obligations a large event has (None: no events).

    Why: an inverted-index page's changelog runs from a few records to
    thousands, and a page due while a big one is in flight waits for it —
    the barrier releases in global-time order, and the workers take their
    inbox in order even with guarantees off.  The overall p50 and p99 mix
    that waiting with each page's own work; split, they say which one a
    change moved.
    """
    if not completions:
        return {"large_units": None, "large": [], "behind_large": [], "alone": []}
    by_size = sorted(units for _due, _latency, units in completions)
    threshold = by_size[min(len(by_size) - 1, int(len(by_size) * (1 - share)))]
    large = sorted((due, due + latency) for due, latency, units in completions if units >= threshold)
    split: dict[str, Any] = {"large_units": threshold, "large": [], "behind_large": [], "alone": []}
    started, latest_end = 0, float("-inf")
    for due, latency, units in sorted(completions):
        while started < len(large) and large[started][0] <= due:  # large events due by now: the latest end
            latest_end = max(latest_end, large[started][1])
            started += 1
        kind = "large" if units >= threshold else "behind_large" if latest_end > due else "alone"
        split[kind].append(round(latency * 1000, 3))
    return split


def head_of_line_figures(split: dict[str, Any]) -> dict[str, Any]:
    """``head_of_line``'s lists as counts and percentiles."""
    figures: dict[str, Any] = {"large_units": split["large_units"]}
    for kind in ("large", "behind_large", "alone"):
        ordered = sorted(split[kind])
        figures[kind] = {"events": len(ordered),
                         "p50_ms": round(percentile(ordered, 0.50), 2) if ordered else None,
                         "p99_ms": round(percentile(ordered, 0.99), 2) if ordered else None}
    return figures


def cpu_per_unit(cpu_seconds: float, units: float) -> float | None:
    """Microseconds of CPU, over every process of the run (the harness's too), per unit of work done: per changelog
    record on the inverted index, per word on word count.  Issue #13 asks for it as the figure that does not depend
    on how fast the machine is this hour (a 2x drift within an hour moves every latency).  None if nothing was done."""
    return round(1e6 * cpu_seconds / units, 1) if units else None


def run(spec: RunSpec) -> dict[str, Any]:
    workload = load_workload(spec.workload)
    system = load(spec.system)
    system.setup(spec, workload)
    try:
        tracker = Tracker(workload.progress())
        pacer = Pacer(spec, workload, tracker)
        meter = TreeMeter()
        meter.start()
        started = time.perf_counter()
        extras = system.run(pacer, tracker)
        elapsed = time.perf_counter() - started
        usage = meter.stop()
    finally:
        system.close()
    check = workload.check(tracker.payloads, tracker.records, system.check_method)
    completed = len(tracker.latencies)
    span = ((tracker.last_done or 0.0) - (tracker.first_due or 0.0)) or elapsed
    pushed = len(tracker.payloads)
    units = tracker.units * completed / pushed if completed else 0.0
    """Units of the completed events (all of them when the run is complete)."""
    return {
        "system": spec.system, "guarantees": system.guarantees, "rate": spec.rate,
        **latency_figures(tracker.latencies),
        "throughput": round(completed / span, 2) if completed else 0.0,
        "units_per_s": round(units / span, 1) if completed else 0.0,
        "events_pushed": pushed, "events_completed": completed, "records_consumed": len(tracker.records),
        **usage, "cpu_us_per_unit": cpu_per_unit(usage["cpu_seconds"], units),
        "replay_overhead": extras.pop("replay_overhead", None),
        "complete": completed == pushed, "correct": check.correct, "check": asdict(check), **extras,
        "latencies_ms": [round(s * 1000, 3) for s in tracker.latencies],
        "head_of_line_ms": head_of_line(tracker.completions),
    }


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m flamestream.bench.runner SPEC.json OUT.json")
    raw = json.loads(Path(sys.argv[1]).read_text())
    spec = RunSpec(**{**raw, "workdir": Path(raw["workdir"])})
    tune_gc()  # every system's harness process alike (consumers keep all records: a growing heap)
    Path(sys.argv[2]).write_text(json.dumps(run(spec)))


if __name__ == "__main__":
    main()
