"""``flamestream supervise``: the process ``up`` leaves running to restart crashed nodes.

A node that dies (kill -9, an essential task's failure, a peer's restart that
makes it restart for recovery) is started again with its own command line,
data dir and port: at once the first time (the cluster's recovery waits for
it), then after a backoff that doubles while it keeps crashing (0.5 s up to
10 s; at once again after it ran for 10 s).  What makes the
restart correct is not here: the restarted process registers as recovering
and the cluster recovers from its last complete snapshot
(``flamestream.runtime.recovery``) — so docker's ``restart: on-failure``,
which plays this role in docker-compose, takes the same path.

A node that hangs rather than dies (SIGSTOP, a deadlocked event loop) is
found by its gRPC health check: every node is asked every ``PROBE_EVERY``
seconds, in the background, and one that has answered before (so a node still
starting up, loading a big snapshot, is never judged) but then gives no
answer at all for ``--hang-timeout`` seconds is killed with SIGKILL and so
restarted like a crashed one.  Any answer counts, NOT_SERVING too: a node
that reports a failed role is alive and says so itself.  The default of 10 s
is long against a healthy node's answer (its event loop is never busy for
more than a fraction of a second: snapshots are encoded in chunks, files are
read off the loop) and short against the recovery the kill starts.

The state file (``DIR/cluster.json``) is the list of what to keep running:
read afresh every round, so nodes that ``scale`` adds are supervised and
nodes it removes (dropped from the file before they are stopped) are not
restarted; each restart is written back, for ``flamestream status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType

from flamestream.runtime.launcher import (
    NODE,
    ProcessRecord,
    health_channel,
    health_status,
    is_alive,
    load_state,
    respawn,
    save_state,
    supervising_path,
)
from flamestream.runtime.spares import Spare

log = logging.getLogger("flamestream.supervise")

POLL = 0.2
"""Seconds between looks at the state file and the health probes; a node's death itself wakes the loop at once
(``_exit_watch``), so a crash is not noticed up to a polling interval late."""
FIRST_BACKOFF = 0.5
"""Seconds before the second restart in a row (the first is at once)."""
MAX_BACKOFF = 10.0
STABLE_AFTER = 10.0
"""Seconds a restarted node must run before its next crash counts as a first one again.  Short, because every
crash also makes the survivors of its tick exit to be restarted: with 30 s, faults 20 s apart (the chaos bench)
grew every node's backoff to 10 s, and the recovery time with it (3 s -> 17 s); a loop that crashes within 10 s
of each start still backs off."""
HANG_TIMEOUT = 10.0
"""Default ``--hang-timeout``: seconds without any health answer before a node that answered once is killed."""
PROBE_EVERY = 1.0
"""Seconds between the health probes of one node (each has a deadline of its own, ``health_status``)."""
SPARES_AFTER = 3.0
"""Seconds without a restart before missing warm spares are started (``flamestream.runtime.spares``): a new
spare's imports would compete with the nodes a recovery is starting."""


class _Backoff:
    def __init__(self) -> None:
        self.delay = 0.0
        self.started = 0.0
        self.due: float | None = None


class _Probes:
    """Health probes of one node process (pid and start time): whether and when it last answered.

    On one channel for the process's life: a channel per probe cost the supervisor 1 % of a core on an idle
    cluster, and every node a connection (a TLS handshake when secured) a second.  A restarted process gets new
    probes, so no channel's reconnect backoff outlives the process it was for.
    """

    def __init__(self, record: ProcessRecord, tls_dir: str | None) -> None:
        self.process = (record.pid, record.started)
        self.channel = health_channel(record.address, tls_dir)
        self.answered: float | None = None
        """When it last gave any answer; None until its first, and only then can it count as hung."""
        self.last = "no answer yet"
        self.pending: Future[str] | None = None
        self.due = 0.0

    def hung(self, record: ProcessRecord, now: float, timeout: float, pool: ThreadPoolExecutor) -> bool:
        """Collect the last probe's answer, send the next when due; whether no answer came for ``timeout``."""
        if self.pending is not None and self.pending.done():
            self.last = self.pending.result()
            self.pending = None
            if not self.last.startswith("unreachable"):
                self.answered = now
        if self.pending is None and now >= self.due:
            self.pending = pool.submit(health_status, record.address, channel=self.channel)
            self.due = now + PROBE_EVERY
        return self.answered is not None and now - self.answered >= timeout

    def close(self) -> None:
        """Close the channel once the probe in flight, if any, is over (``Future`` callbacks run at once if so)."""
        if self.pending is None:
            self.channel.close()
        else:
            self.pending.add_done_callback(lambda _: self.channel.close())


class _ExitWatch:
    """Sleeps that end early when a watched process exits: a process file descriptor per pid (Linux 5.3+),
    readable once the process is gone.  Without ``pidfd_open`` (or for a pid already gone) a plain sleep.

    Why: every recovery starts with the supervisor restarting the dead node, and a fixed 0.2 s poll added
    0.1 s on average, twice in a row when the survivors restart too (issue #11's recovery target is 2 s).
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def watch(self, pid: int) -> None:
        if pid in self._fds or not hasattr(os, "pidfd_open"):
            return
        with contextlib.suppress(OSError):  # gone already, or no pidfd on this kernel: the next poll sees it
            self._fds[pid] = os.pidfd_open(pid)

    def wait(self, timeout: float) -> None:
        """Sleep ``timeout`` seconds or until a watched process exits; forget the ones that did."""
        if not self._fds:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(list(self._fds.values()), [], [], timeout)
        for pid, fd in list(self._fds.items()):
            if fd in ready:
                os.close(fd)
                del self._fds[pid]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def supervise(data_dir: Path, hang_timeout: float = HANG_TIMEOUT, spares: bool = True) -> int:
    """Restart the nodes recorded in ``data_dir``'s state file whenever they die — or hang for ``hang_timeout``
    seconds (0: never judged) — until SIGTERM (exit 0) or the state file is gone (the cluster was taken down).

    ``spares``: keep a warm spare per node, which a restart of that node becomes (``flamestream.runtime.spares``).
    """
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    exits = _ExitWatch()
    warm = _Spares(data_dir) if spares else None
    log.info("supervising the nodes of %s (hang timeout %s, warm spares %s)", data_dir,
             f"{hang_timeout:g}s" if hang_timeout > 0 else "off", "on" if spares else "off")
    supervising = supervising_path(data_dir)
    supervising.write_text(str(os.getpid()))  # ``up`` returns once it reads this pid (a torn read is no pid)
    try:
        _supervise(data_dir, hang_timeout, lambda: stopping, exits, warm)
    finally:
        exits.close()
        if warm is not None:
            warm.close()
        with contextlib.suppress(OSError, ValueError):
            if int(supervising.read_text()) == os.getpid():
                supervising.unlink()
    log.info("stopped")
    return 0


def _supervise(data_dir: Path, hang_timeout: float, stopping: Callable[[], bool], exits: _ExitWatch,
               warm: _Spares | None) -> None:
    backoffs: dict[str, _Backoff] = {}
    probes: dict[str, _Probes] = {}
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="health")
    while not stopping():
        state = load_state(data_dir)
        if state is None:
            log.info("the cluster's state file is gone: stopping")
            break
        restarted: set[str] = set()
        now = time.monotonic()
        for record in state.processes:
            if record.role != NODE:
                continue
            if is_alive(record.pid, record.started):
                exits.watch(record.pid)
                if hang_timeout > 0 and record.address:
                    _kill_if_hung(record, probes, now, hang_timeout, pool, state.tls_dir or None)
                continue
            gone = probes.pop(record.name, None)
            if gone is not None:
                gone.close()
            backoff = backoffs.setdefault(record.name, _Backoff())
            if backoff.due is None:
                if now - backoff.started > STABLE_AFTER:
                    backoff.delay = 0.0
                backoff.due = now + backoff.delay
                log.warning("node %s (pid %d) is gone; restarting it in %.1fs", record.name, record.pid,
                            backoff.delay)
            if now < backoff.due or stopping():
                continue
            spare = warm.take(record.name) if warm is not None else None
            became = respawn(data_dir, record, spare)
            if spare is not None and not became:
                spare.stop()
            backoff.started, backoff.due = now, None
            backoff.delay = min(max(backoff.delay * 2, FIRST_BACKOFF), MAX_BACKOFF)
            log.warning("restarted node %s as pid %d (restart %d%s)", record.name, record.pid, record.restarts,
                        ", a warm spare" if became else "")
            restarted.add(record.name)
        for name in probes.keys() - {record.name for record in state.processes}:  # scaled down
            probes.pop(name).close()
        if restarted:
            # Written back from a fresh read, so a ``scale`` that saved meanwhile is not undone.
            latest = load_state(data_dir)
            if latest is not None:
                fresh = {p.name: p for p in state.processes if p.name in restarted}
                for record in latest.processes:
                    if record.name in fresh and record.role == NODE:
                        new = fresh[record.name]
                        record.pid, record.started, record.restarts = new.pid, new.started, new.restarts
                save_state(data_dir, latest)
        if warm is not None:
            warm.keep([record.name for record in state.processes if record.role == NODE],
                      quiet=not restarted and all(b.due is None for b in backoffs.values()))
        exits.wait(POLL)
    for probe in probes.values():
        probe.close()
    pool.shutdown(wait=False, cancel_futures=True)


class _Spares:
    """A warm spare per node name, started once the cluster has had no restart for ``SPARES_AFTER`` s."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.ready: dict[str, Spare] = {}
        self.quiet_since = time.monotonic()

    def take(self, name: str) -> Spare | None:
        return self.ready.pop(name, None)

    def keep(self, names: list[str], quiet: bool) -> None:
        """A spare for each of ``names`` (the nodes of the state file), none for any other name."""
        now = time.monotonic()
        if not quiet:
            self.quiet_since = now
        for name in [n for n in self.ready if n not in names]:  # a node ``scale`` removed
            self.ready.pop(name).stop()
        for name in names:
            spare = self.ready.get(name)
            if spare is not None and not spare.alive():
                log.warning("the warm spare for node %s (pid %d) died (exit code %s)", name, spare.process.pid,
                            spare.process.returncode)
                del self.ready[name]
            if name not in self.ready and now - self.quiet_since >= SPARES_AFTER:
                self.ready[name] = Spare.start(self.data_dir)

    def close(self) -> None:
        for spare in self.ready.values():
            spare.stop()
        self.ready.clear()


def _kill_if_hung(record: ProcessRecord, probes: dict[str, _Probes], now: float, timeout: float,
                  pool: ThreadPoolExecutor, tls_dir: str | None) -> None:
    """SIGKILL ``record``'s process if it stopped answering its health check (it is restarted as a dead one)."""
    probe = probes.get(record.name)
    if probe is None or probe.process != (record.pid, record.started):  # a new process: judged afresh
        if probe is not None:
            probe.close()
        probe = probes[record.name] = _Probes(record, tls_dir)
    if not probe.hung(record, now, timeout, pool):
        return
    assert probe.answered is not None
    log.warning("node %s (pid %d) hangs: no answer to its health check for %.1fs (last: %s); killing it (SIGKILL) "
                "to restart it", record.name, record.pid, now - probe.answered, probe.last)
    probes.pop(record.name).close()
    if is_alive(record.pid, record.started):
        os.kill(record.pid, signal.SIGKILL)
