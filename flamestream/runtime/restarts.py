"""``flamestream supervise``: the process ``up`` leaves running to restart crashed nodes.

A node that dies (kill -9, an essential task's failure, a peer's restart that
makes it restart for recovery) is started again with its own command line,
data dir and port, after a backoff that doubles while it keeps crashing
(0.5 s up to 10 s, back to 0.5 s once it ran for 30 s).  What makes the
restart correct is not here: the restarted process registers as recovering
and the cluster recovers from its last complete snapshot
(``flamestream.runtime.recovery``) — so docker's ``restart: on-failure``,
which plays this role in docker-compose, takes the same path.

The state file (``DIR/cluster.json``) is the list of what to keep running:
read afresh every round, so nodes that ``scale`` adds are supervised and
nodes it removes (dropped from the file before they are stopped) are not
restarted; each restart is written back, for ``flamestream status``.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from types import FrameType

from flamestream.runtime.launcher import NODE, is_alive, load_state, respawn, save_state

log = logging.getLogger("flamestream.supervise")

POLL = 0.2
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0
STABLE_AFTER = 30.0
"""Seconds a restarted node must run before its next crash counts as a first one again."""


class _Backoff:
    def __init__(self) -> None:
        self.delay = FIRST_BACKOFF
        self.started = 0.0
        self.due: float | None = None


def supervise(data_dir: Path) -> int:
    """Restart the nodes recorded in ``data_dir``'s state file whenever they die, until SIGTERM (exit 0) or the
    state file is gone (the cluster was taken down)."""
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    backoffs: dict[str, _Backoff] = {}
    log.info("supervising the nodes of %s", data_dir)
    while not stopping:
        state = load_state(data_dir)
        if state is None:
            log.info("the cluster's state file is gone: stopping")
            return 0
        restarted: set[str] = set()
        now = time.monotonic()
        for record in state.processes:
            if record.role != NODE or is_alive(record.pid, record.started):
                continue
            backoff = backoffs.setdefault(record.name, _Backoff())
            if backoff.due is None:
                if now - backoff.started > STABLE_AFTER:
                    backoff.delay = FIRST_BACKOFF
                backoff.due = now + backoff.delay
                log.warning("node %s (pid %d) is gone; restarting it in %.1fs", record.name, record.pid,
                            backoff.delay)
                continue
            if now < backoff.due or stopping:
                continue
            respawn(data_dir, record)
            backoff.started, backoff.due = now, None
            backoff.delay = min(backoff.delay * 2, MAX_BACKOFF)
            log.warning("restarted node %s as pid %d (restart %d)", record.name, record.pid, record.restarts)
            restarted.add(record.name)
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
        time.sleep(POLL)
    log.info("stopped")
    return 0
