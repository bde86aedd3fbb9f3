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
    return {
        "system": spec.system, "guarantees": system.guarantees, "rate": spec.rate,
        **latency_figures(tracker.latencies),
        "throughput": round(completed / span, 2) if completed else 0.0,
        "units_per_s": round(tracker.units * completed / pushed / span, 1) if completed else 0.0,
        "events_pushed": pushed, "events_completed": completed, "records_consumed": len(tracker.records),
        **usage, "replay_overhead": extras.pop("replay_overhead", None),
        "complete": completed == pushed, "correct": check.correct, "check": asdict(check), **extras,
        "latencies_ms": [round(s * 1000, 3) for s in tracker.latencies],
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
