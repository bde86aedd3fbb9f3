"""What every system's run shares: the paced input, the latency clock and the meters.

Latency is taken from an event's *scheduled* push time (not the moment the
pusher got round to it), so a system that falls behind its rate pays for the
queue it builds — no coordinated omission.  In ``max`` mode (no rate) events
are due as soon as the backlog of unfinished events allows, and latency runs
from the actual push.

CPU seconds and peak RSS cover the system's whole process tree (a Spark JVM,
the cluster's services) from the end of its set-up to the end of its run.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from flamestream.bench.workloads import Progress, Record, Workload
from flamestream.runtime.launcher import node_name

MAX_BATCH = 256
"""Most events handed to a system's push at once (all of them already due)."""


@dataclass
class RunSpec:
    workload: str
    system: str
    rate: float | None
    """Events per second (Poisson); None pushes as fast as the backlog bound allows."""
    duration: float
    seed: int
    workers: int
    exactly_once: bool
    workdir: Path
    drain_timeout: float = 60.0
    snapshot_interval_ms: int = 1000
    """flamestream's workers snapshot their state this often (0: never)."""
    max_backlog: int = 2000
    """Unfinished events at most, in max mode: keeps a closed loop instead of an unbounded queue."""


class Tracker:
    """Event id -> scheduled time -> completion time, fed by a system's consumer (thread-safe)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._due: dict[str, tuple[float, int]] = {}
        """Unfinished event id -> (scheduled time, its obligations)."""
        self.latencies: list[float] = []
        """Seconds, in completion order."""
        self.completions: list[tuple[float, float, int]] = []
        """(scheduled time, latency in seconds, obligations) of each event that had obligations, in completion
        order: what ``runner.head_of_line`` splits the latencies by."""
        self.records: list[Record] = []
        self.payloads: list[Any] = []
        """Pushed payloads in push order (global-time order for a single producer)."""
        self.units = 0
        """Pushed work in the workload's unit: each event's obligations (its words, or its changelog records)."""
        self.first_due: float | None = None
        self.last_done: float | None = None
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self._all_done.set()

    def expect(self, event_id: str, payload: Any, due: float) -> None:
        with self._lock:
            self.payloads.append(payload)
            if self.first_due is None:
                self.first_due = due
            obligations = self._progress.expect(event_id, payload)
            self.units += obligations
            if obligations:
                self._due[event_id] = (due, obligations)
                self._all_done.clear()
            else:
                self.latencies.append(0.0)

    def observe(self, records: list[Record], now: float | None = None) -> None:
        """Records a system's consumer just received (``now``: when, default the current time)."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            self.records.extend(records)
            for record in records:
                for event_id in self._progress.observe(record):
                    due, obligations = self._due.pop(event_id)
                    self.latencies.append(now - due)
                    self.completions.append((due, now - due, obligations))
                    self.last_done = now
            if not self._due:
                self._all_done.set()

    @property
    def pending(self) -> int:
        return len(self._due)

    def wait_all(self, timeout: float) -> bool:
        return self._all_done.wait(timeout)


class Pacer:
    """Due events of a seeded Poisson stream (or a backlog-bound closed loop), in batches."""

    def __init__(self, spec: RunSpec, workload: Workload, tracker: Tracker) -> None:
        self._spec = spec
        self._events = workload.events(spec.seed)
        self._tracker = tracker
        self._rng = random.Random(spec.seed)
        self._start = 0.0
        self._next_due = 0.0

    def start(self) -> None:
        self._start = self._next_due = time.perf_counter()
        if self._spec.rate is not None:
            self._next_due += self._rng.expovariate(self._spec.rate)

    def _over(self, now: float) -> bool:
        return now - self._start >= self._spec.duration

    def step(self) -> tuple[float, list[tuple[str, Any]]] | None:
        """(seconds to wait before asking again, due events to push now); None when the run is over."""
        now = time.perf_counter()
        if self._spec.rate is None:
            if self._over(now):
                return None
            room = min(MAX_BATCH, self._spec.max_backlog - self._tracker.pending)
            if room <= 0:
                return 0.001, []
            return 0.0, [self._take(now) for _ in range(room)]
        batch: list[tuple[str, Any]] = []
        while self._next_due <= now and len(batch) < MAX_BATCH:
            if self._over(self._next_due):
                return None if not batch else (0.0, batch)
            batch.append(self._take(self._next_due))
            self._next_due += self._rng.expovariate(self._spec.rate)
        if self._over(self._next_due) and not batch:
            return None
        return max(0.0, self._next_due - time.perf_counter()), batch

    def _take(self, due: float) -> tuple[str, Any]:
        event_id, payload = next(self._events)
        self._tracker.expect(event_id, payload, due)
        return event_id, payload

    def batches(self) -> Iterator[list[tuple[str, Any]]]:
        """Blocking iteration: sleeps until events are due."""
        self.start()
        while (step := self.step()) is not None:
            wait, batch = step
            if batch:
                yield batch
            elif wait:
                time.sleep(min(wait, 0.05))

    async def abatches(self) -> Any:
        """Async iteration (an async generator) for asyncio pushers."""
        self.start()
        while (step := self.step()) is not None:
            wait, batch = step
            if batch:
                yield batch
            else:
                await asyncio.sleep(min(wait, 0.05))


def _high_water_rss(proc: psutil.Process) -> int:
    """The process's peak RSS so far (Linux VmHWM), or its current RSS where the kernel does not say."""
    try:
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(proc.memory_info().rss)


@dataclass
class TreeMeter:
    """CPU seconds and peak RSS of this process and all its descendants.

    Peak RSS is the sum of every process's own high-water mark: an upper bound
    of the tree's peak, exact when all peak together, and immune to sampling
    gaps.  CPU seconds count from ``start`` (processes already running then
    are charged only what they use after it).
    """

    interval: float = 1.0
    """Walking a process tree costs a few ms: sampled rarely, so the meter does not load what it measures."""
    cpu_at_start: dict[tuple[int, float], float] = field(default_factory=dict)
    cpu_latest: dict[tuple[int, float], float] = field(default_factory=dict)
    peak_rss: dict[tuple[int, float], int] = field(default_factory=dict)
    roles: dict[tuple[int, float], str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> dict[tuple[int, float], float]:
        root = psutil.Process(os.getpid())
        cpu: dict[tuple[int, float], float] = {}
        for proc in [root, *root.children(recursive=True)]:
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    if key not in self.roles:
                        self.roles[key] = "harness" if proc.pid == root.pid else _role(proc.cmdline())
                    times = proc.cpu_times()
                    cpu[key] = times.user + times.system
                    self.peak_rss[key] = max(self.peak_rss.get(key, 0), _high_water_rss(proc))
            except psutil.Error:
                continue  # ended between listing and reading
        return cpu

    def start(self) -> None:
        self.cpu_at_start = self._sample()
        self.cpu_latest = dict(self.cpu_at_start)
        self._thread = threading.Thread(target=self._run, name="tree-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.cpu_latest.update(self._sample())

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cpu_latest.update(self._sample())
        by_role: dict[str, float] = {}
        for key, value in self.cpu_latest.items():
            role = self.roles.get(key, "?")
            by_role[role] = by_role.get(role, 0.0) + value - self.cpu_at_start.get(key, 0.0)
        return {"cpu_seconds": round(sum(by_role.values()), 4),
                "cpu_seconds_by_process": {role: round(used, 4) for role, used in sorted(by_role.items())},
                "peak_rss_mb": round(sum(self.peak_rss.values()) / 2**20, 1)}


def _role(cmdline: list[str]) -> str:
    """What a process of the tree is, for the CPU breakdown: a node's name (``node0``), a module run with -m
    (``flamestream.bench.runner``), else its program."""
    name = node_name(cmdline) if "node" in cmdline else None
    if name is not None:
        return name
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    return os.path.basename(cmdline[0]) if cmdline else "?"
