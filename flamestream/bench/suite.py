"""``flamestream bench``: every system on one workload, interleaved, in one invocation.

Order of a run: for each round, for each rate (the main rate, then any sweep
rates), every system in turn — flamestream exactly-once first, flamestream
with guarantees off, then the peers — each in a fresh runner process (see
:mod:`.runner`), so the machine's drift hits all systems alike.  With
``--throughput`` every system also runs once in max mode (a closed loop as
fast as the system absorbs), and each is reported as a ratio to the
plain-Python loop (and to Bytewax) measured in the same invocation.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

import flamestream.core as core
from flamestream.bench.harness import RunSpec
from flamestream.bench.report import plot_cdf, write_result
from flamestream.bench.runner import LARGE_SHARE, head_of_line_figures, latency_figures
from flamestream.bench.workloads import WORKLOADS

SUSTAINABLE_P99_MS = 100.0
OURS, OURS_OFF = "flamestream", "flamestream (guarantees off)"
OURS_SEPARATE = "flamestream (a process per role)"
OURS_TLS = "flamestream (TLS)"


@dataclass
class Options:
    workload: str
    rate: float
    duration: float = 10.0
    workers: int = 2
    peers: list[str] = field(default_factory=lambda: ["spark", "bytewax", "python"])
    guarantees: str = "both"
    """exactly-once, off, or both (ours run twice: fair both ways against peers without exactly-once)."""
    placement: str = "nodes"
    """nodes, separate, or both: ours exactly-once also with a process per role (before/after co-location)."""
    snapshot_intervals: list[int] = field(default_factory=lambda: [1000])
    """Ours exactly-once once per snapshot interval in ms (0: off): what snapshots cost, side by side."""
    sweep: list[float] = field(default_factory=list)
    throughput: bool = False
    rounds: int = 1
    seed: int = 1
    out: Path = Path("bench-results")
    drain_timeout: float = 60.0
    tls: bool = False
    """Ours exactly-once also as ``up --tls``, next to the insecure default: what transport security costs."""


def _systems(options: Options) -> list[tuple[str, str, bool, int]]:
    """(entry name, system module, exactly-once, snapshot interval) in report order: ours first."""
    first, *others = options.snapshot_intervals
    ours = []
    if options.guarantees in ("exactly-once", "both") and options.placement in ("nodes", "both"):
        ours.append((OURS, "flamestream", True, first))
        ours += [(f"{OURS} (snapshots {'off' if ms == 0 else f'every {ms} ms'})", "flamestream", True, ms)
                 for ms in others]
    if options.tls and options.guarantees in ("exactly-once", "both"):
        ours.append((OURS_TLS, "flamestream-tls", True, first))
    if options.guarantees in ("exactly-once", "both") and options.placement in ("separate", "both"):
        ours.append((OURS_SEPARATE, "flamestream-separate", True, first))
    if options.guarantees in ("off", "both"):
        ours.append((OURS_OFF, "flamestream", False, first))
    return ours + [(peer, peer, True, first) for peer in options.peers]


def _run_one(options: Options, system: str, exactly_once: bool, snapshot_interval_ms: int, rate: float | None,
             workdir: Path) -> dict[str, Any]:
    """One runner process; a system that fails is reported with its error instead of ending the whole run."""
    workdir.mkdir(parents=True)
    spec = RunSpec(workload=options.workload, system=system, rate=rate, duration=options.duration, seed=options.seed,
                   workers=options.workers, exactly_once=exactly_once, workdir=workdir,
                   drain_timeout=options.drain_timeout, snapshot_interval_ms=snapshot_interval_ms)
    spec_path, out_path = workdir / "spec.json", workdir / "out.json"
    spec_path.write_text(json.dumps({**asdict(spec), "workdir": str(workdir)}))
    done = subprocess.run([sys.executable, "-m", "flamestream.bench.runner", str(spec_path), str(out_path)],
                          capture_output=True, text=True, timeout=options.duration * 3 + options.drain_timeout + 300)
    (workdir / "runner.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not out_path.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"system": system, "rate": rate, "error": f"exit {done.returncode}: {tail[0]}",
                "log": str(workdir / "runner.log")}
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def _pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one system at one rate: latencies pooled, the other figures' median."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    latencies = [v for r in ok for v in r["latencies_ms"]]
    pooled = {**ok[0], **latency_figures([v / 1000 for v in latencies]), "latencies_ms": latencies,
              "rounds": len(ok), "correct": all(r["correct"] for r in ok)}
    if all("head_of_line_ms" in r for r in ok):  # the same seed every round: the same events are large
        splits = [r["head_of_line_ms"] for r in ok]
        pooled["head_of_line"] = head_of_line_figures(
            {"large_units": splits[0]["large_units"],
             **{kind: [v for split in splits for v in split[kind]] for kind in ("large", "behind_large", "alone")}})
    for key in ("throughput", "units_per_s", "cpu_seconds", "cpu_us_per_unit", "peak_rss_mb", "replay_overhead"):
        values = [r[key] for r in ok if r.get(key) is not None]
        pooled[key] = round(statistics.median(values), 4) if values else None
    roles = {role for r in ok for role in r.get("cpu_seconds_by_process", {})}
    pooled["cpu_seconds_by_process"] = {
        role: round(statistics.median(r["cpu_seconds_by_process"].get(role, 0.0) for r in ok), 2)
        for role in sorted(roles)}
    return pooled


def _machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def _versions() -> dict[str, str | None]:
    """The packages' versions, and which build of flamestream's core ran: "compiled" or "pure" (``core.BUILD``, as
    this process chose it; the nodes it starts choose by the same check on the same tree).  Why: a compiled module
    whose source is newer than its build runs pure, with a warning only in the nodes' logs, and such a run read as
    a quarter more CPU in an A/B that compared the two builds by accident."""
    found: dict[str, str | None] = {"flamestream core": core.BUILD}
    for package in ("flamestream", "pyspark", "bytewax", "grpcio", "kazoo"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run_suite(options: Options, say: Any = print) -> Path:
    """Run everything; returns the directory holding result.json and latency.png."""
    systems = _systems(options)
    kind = WORKLOADS[options.workload]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    directory = options.out / stamp
    directory.mkdir(parents=True, exist_ok=False)
    rates: list[float | None] = [options.rate, *options.sweep]
    if options.throughput:
        rates.append(None)
    runs: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    machine = _machine()
    with tempfile.TemporaryDirectory(prefix="flamestream-bench-") as scratch:
        for round_number in range(options.rounds):
            for rate in rates:
                for name, system, exactly_once, snapshot_interval in systems:
                    label = "max" if rate is None else f"{rate:g}/s"
                    say(f"bench: round {round_number + 1}/{options.rounds}, {label}: {name} ...")
                    workdir = Path(scratch) / (f"r{round_number}-{label.replace('/', '')}-{system}-{int(exactly_once)}"
                                               f"-{snapshot_interval}")
                    entry = _run_one(options, system, exactly_once, snapshot_interval, rate, workdir)
                    runs.setdefault((name, rate), []).append(entry)
                    say(f"bench:   {_summary(entry)}")
    pooled = {key: _pool(value) for key, value in runs.items()}
    main = [{"name": name, **_without_latencies(pooled[(name, options.rate)])} for name, *_ in systems]
    result: dict[str, Any] = {
        "benchmark": options.workload, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rate": options.rate, "rate_unit": kind.rate_unit,
        "duration_s": options.duration, "workers": options.workers, "seed": options.seed, "rounds": options.rounds,
        "machine": machine, "versions": _versions(), "systems": main,
    }
    if options.sweep:
        sweep_rates = sorted({options.rate, *options.sweep})
        result["sweep"] = {name: [_brief(pooled[(name, r)]) for r in sweep_rates] for name, *_ in systems}
        result["max_sustainable_rate"] = {
            name: max((r for r in sweep_rates if _sustainable(pooled[(name, r)])), default=None)
            for name, *_ in systems}
    if options.throughput:
        best = {name: pooled[(name, None)].get("units_per_s") for name, *_ in systems}
        result["max_throughput"] = {
            "unit": f"{kind.unit}/s",
            "systems": {name: _brief(pooled[(name, None)]) for name, *_ in systems},
            "ratio_to_python": {name: _ratio(v, best.get("python")) for name, v in best.items()},
            "ratio_to_bytewax": {name: _ratio(v, best.get("bytewax")) for name, v in best.items()},
        }
    result["comparisons"] = _comparisons(main)
    write_result(directory, result)
    plot = plot_cdf(directory / "latency.png",
                    f"{options.workload} at {options.rate:g} {result['rate_unit']}, {options.workers} workers",
                    {name: pooled[(name, options.rate)].get("latencies_ms", []) for name, *_ in systems})
    if plot is None:
        say("bench: latency.png not drawn: matplotlib is missing (pip install 'flamestream[bench]')")
    return directory


def _without_latencies(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("latencies_ms", "head_of_line_ms", "system")}


def _brief(entry: dict[str, Any]) -> dict[str, Any]:
    keys = ("rate", "p50_ms", "p99_ms", "throughput", "units_per_s", "cpu_seconds", "cpu_us_per_unit",
            "replay_overhead", "correct", "events_pushed", "events_completed", "error")
    return {k: entry[k] for k in keys if k in entry}


def _sustainable(entry: dict[str, Any]) -> bool:
    return ("error" not in entry and entry["p99_ms"] is not None and entry["p99_ms"] < SUSTAINABLE_P99_MS
            and entry["events_completed"] == entry["events_pushed"])


def _summary(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return f"{entry['system']}: FAILED {entry['error']} (log: {entry['log']})"
    return (f"{entry['system']} ({entry['guarantees']}): p50 {entry['p50_ms']} ms, p99 {entry['p99_ms']} ms, "
            f"{entry['units_per_s']} units/s, {entry['cpu_us_per_unit']} µs of CPU a unit, "
            f"{entry['events_completed']}/{entry['events_pushed']} done, "
            f"correct={entry['correct']}{_behind_large(entry)}")


def _behind_large(entry: dict[str, Any]) -> str:
    """The summary's note on events that waited behind a large one (``runner.head_of_line``)."""
    split = entry.get("head_of_line_ms")
    if not split or not split["behind_large"]:
        return ""
    figures = head_of_line_figures(split)
    return (f"; the other events' p50 {figures['alone']['p50_ms']} ms, {figures['behind_large']['p50_ms']} ms for "
            f"the {figures['behind_large']['events']} due while one of the largest {LARGE_SHARE:.0%} "
            f"(>= {figures['large_units']} units) was unfinished")


def _comparisons(main: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each peer's p50 divided by ours (>1: ours is faster, by that factor), per guarantee level."""
    by_name = {entry["name"]: entry for entry in main}
    out: dict[str, float | None] = {}
    for ours in (OURS, OURS_OFF):
        if ours not in by_name:
            continue
        for entry in main:
            if entry["name"] not in (OURS, OURS_OFF, OURS_SEPARATE, OURS_TLS):
                out[f"{entry['name']}_p50_over_{'ours' if ours == OURS else 'ours_off'}_p50"] = _ratio(
                    entry.get("p50_ms"), by_name[ours].get("p50_ms"))
    if OURS in by_name and OURS_SEPARATE in by_name:  # what co-locating roles on nodes buys (>1: nodes are faster)
        for figure in ("p50_ms", "p99_ms", "cpu_seconds"):
            out[f"separate_{figure}_over_nodes"] = _ratio(by_name[OURS_SEPARATE].get(figure),
                                                          by_name[OURS].get(figure))
    return out
