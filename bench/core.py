"""The core alone: ``Worker.run`` and trimming, one worker over the whole hash range, no services, on the events
of ``flamestream bench``'s two workloads.  Prints one JSON object.

Why: a cluster run resolves a change of a tenth at best on this machine (its speed drifts ~2x within an hour),
and the core is a third of the nodes' CPU, so a step of a few percent in the core is lost in it.  Under
``--instructions`` each workload runs twice under ``valgrind --tool=callgrind`` (Debian's ``valgrind``), at
``--lines``/``--pages`` and at twice that, and the difference of the instructions counted over the difference
of the units done is the core's instructions per word (per changelog record): what start-up, imports and
stamping cost cancels out, and the count is the same for the same code at any hour, so two versions of the
core compare with one run each.  Callgrind counts no cache misses: confirm a gain in time as well.  The
cyclic collector is off during a run (the nodes run it rarely: ``runtime.heap``); its pauses would be noise.

    python bench/core.py [--lines 8000] [--pages 200] [--seed 1] [--rounds 3] [--instructions]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from flamestream.bench.workloads import workload as load_workload
from flamestream.core import BUILD
from flamestream.core.front import stamp_inputs
from flamestream.core.item import Item
from flamestream.core.meta import MAX_TIME
from flamestream.core.plan import compile_graph
from flamestream.core.tick import Layout
from flamestream.core.worker import Worker, entry_hash, front_envelopes

WORKLOADS = {"wordcount": ("lines", 100), "inverted-index": ("pages", 20)}
"""Workload -> the option giving its size, and how many of its events go in per step (the min time then moves
past them, as the acker's would)."""


def run(name: str, events: int, seed: int) -> tuple[int, float]:
    """Units done (a word's count, a changelog record: every record reaching the sink) and CPU seconds of ``events``
    of workload ``name`` through one worker."""
    workload = load_workload(name)
    generated = workload.events(seed)
    payloads = [next(generated)[1] for _ in range(events)]
    plan = compile_graph(workload.graph())
    layout = Layout.even(1)
    stamped = stamp_inputs(payloads)
    step = WORKLOADS[name][1]
    worker = Worker(plan, 0, layout)
    units = 0
    gc.disable()
    started = time.process_time()
    for start in range(0, len(stamped), step):
        part = stamped[start:start + step]
        inputs: list[tuple[int, Item]] = []
        for _front, gt, trace, payload in part:
            h = entry_hash(plan, payload)
            if h is None:
                raise SystemExit(f"a front would refuse the event {payload!r:.100}")
            inputs.append((h, (payload, gt, trace, False)))
        for envelopes in front_envelopes(plan, layout, inputs).values():
            for _remote, sink in worker.run(envelopes, 256):
                units += len(sink)
        worker.on_min_time(part[-1][1])
    worker.on_min_time(MAX_TIME)
    seconds = time.process_time() - started
    gc.enable()
    return units, seconds


def instructions(name: str, events: int, seed: int) -> tuple[int, int]:
    """(units, instructions) of a run of ``events`` under callgrind, in a child process."""
    with tempfile.TemporaryDirectory() as scratch:
        child = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch}/callgrind.out", sys.executable,
             __file__, "--only", name, "--events", str(events), "--seed", str(seed)],
            capture_output=True, text=True, check=False)
    counted = re.search(r"Collected : (\d+)", child.stderr)
    if child.returncode != 0 or counted is None:
        raise SystemExit(f"callgrind run of {name} failed (exit {child.returncode}): {child.stderr[-2000:]}")
    return json.loads(child.stdout)["units"], int(counted.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=8000, help="word count's lines (default 8000)")
    parser.add_argument("--pages", type=int, default=200, help="inverted index's pages (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each workload, median (default 3)")
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions a unit under callgrind (needs valgrind)")
    parser.add_argument("--only", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)  # a callgrind child
    parser.add_argument("--events", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        units, _seconds = run(args.only, args.events, args.seed)
        print(json.dumps({"units": units}))
        return
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    report: dict[str, Any] = {"benchmark": "core", "build": BUILD, "seed": args.seed, "rounds": args.rounds,
                              "python": sys.version.split()[0], "cores": os.cpu_count()}
    for name, (option, _step) in WORKLOADS.items():
        events = getattr(args, option)
        timed = [run(name, events, args.seed) for _ in range(args.rounds)]
        units = timed[0][0]
        figures: dict[str, Any] = {option: events, "units": units,
                                   "cpu_us_per_unit": round(statistics.median(s for _u, s in timed) / units * 1e6, 2)}
        if args.instructions:
            (small, counted), (large, counted_twice) = (instructions(name, n, args.seed) for n in (events, 2 * events))
            figures["instructions_per_unit"] = round((counted_twice - counted) / (large - small))
        report[name] = figures
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
