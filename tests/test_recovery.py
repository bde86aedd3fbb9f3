"""Crash recovery for real: kill -9 a process mid-stream; the supervisor restarts it, the cluster recovers from its
last complete snapshot, and the topic still holds exactly the oracle's output (issue #11).

Victims: either node of ``up --nodes 2``, and each role of ``--placement
separate`` (worker, front, barrier, acker: a process each); also a worker
killed while its snapshot file is half written, and a second kill during the
recovery.  The pushes go on through the crash with an idempotent producer: a
push in flight when its front died is retried with the same sequence numbers
and admitted once (``Pusher`` pushes as producer "steady"); a consumer
follows the topic live through it all (``Consumer``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream import run_oracle
from flamestream.client import Client
from flamestream.cluster import WORKER, ClusterStore
from flamestream.coordinator.zookeeper import ZooKeeperServer
from flamestream.core.meta import GlobalTime, boundary_of
from flamestream.runtime import recovery
from flamestream.storage.input_log import read_input_logs
from tests.test_cluster_e2e import as_multiset, cli
from tests.test_handover_cluster import Pusher, lines
from tests.test_nodes import eventually

pytestmark = pytest.mark.slow


def _state(data: Path) -> dict[str, Any]:
    return json.loads((data / "cluster.json").read_text())  # type: ignore[no-any-return]


def _node(data: Path, name: str) -> dict[str, Any]:
    return next(p for p in _state(data)["processes"] if p["name"] == name)


class Consumer(threading.Thread):
    """A consumer following the topic live through the crash (group "live", committing each batch), as an
    application would: it must reach ``target`` records without anyone restarting it.

    Its subscription outlives the barrier's restart by itself (the SDK
    resubscribes); every ``IDLE`` s without any record it ends the
    subscription to look at ``stop`` (a failed test) and ``target`` (set once
    the pushes are over), and then goes on from the committed offsets.
    """

    IDLE = 2.0

    def __init__(self, zookeeper: str, cluster: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(zookeeper, cluster, retries=40)  # rides out a recovery, like the pusher
        self.records: list[tuple[GlobalTime, Any]] = []
        self.target: int | None = None
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set() and not self.done():
                for batch in self.client.consume_batches(group="live", timeout=self.IDLE):
                    self.records += [(record.time, record.payload) for record in batch]
                    for record in {record.partition: record for record in batch}.values():
                        self.client.commit(record)
                    if self.done():
                        return
        except BaseException as exc:
            self.error = exc
        finally:
            self.client.close()

    def done(self) -> bool:
        return self.target is not None and len(self.records) >= self.target


def _recovery_ticks(store: ClusterStore, after: int) -> int:
    return sum(1 for _, tick in store.ticks()[after:] if tick.get("recovery"))


def _kill_and_check(data: Path, zookeeper: str, cluster: str, up_args: list[str],
                    kill: Callable[[ClusterStore], int]) -> None:
    """Up with ``up_args``, word count under a steady idempotent pusher and a live consumer; once a complete
    snapshot exists, ``kill`` (which waits for its own positive signals and returns how many recovery ticks it
    causes); then those recovery ticks, pushes after them, and both the live consumer and a fresh one read exactly
    the oracle of the input logs."""
    up = cli("up", *up_args, "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster)
    assert up.returncode == 0, up.stdout + up.stderr
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster).returncode == 0
    pusher = Pusher(zookeeper, cluster, lines(), 0.02, retries=40)  # rides out a recovery
    consumer = Consumer(zookeeper, cluster)
    pusher.start()
    consumer.start()
    try:
        with ClusterStore(zookeeper, cluster=cluster) as store:
            eventually(lambda: pusher.pushed >= 300 and any(store.complete_snapshots(n, 2) for n, _ in store.ticks()),
                       "a complete snapshot of a running stream")
            ticks = len(store.ticks())
            recoveries = kill(store)
            eventually(lambda: _recovery_ticks(store, ticks) >= recoveries, "the recovery tick", timeout=120)
        pushed_after = pusher.pushed
        eventually(lambda: pusher.pushed >= pushed_after + 200 or pusher.error is not None,
                   "pushes after recovery", timeout=120)
        pusher.stop.set()
        pusher.join(60)
        assert pusher.error is None, pusher.error
        expected = run_oracle(wordcount.graph(), read_input_logs(data))[0]
        assert len(expected) == 7 * pusher.pushed  # every acknowledged push is in the input logs, once
        consumer.target = len(expected)
        eventually(lambda: len(consumer.records) >= len(expected) or not consumer.is_alive(), "the live consumer",
                   timeout=180)
        consumer.join(30)
        assert consumer.error is None, consumer.error
    finally:  # after a failure above: a client left running would keep the interpreter from exiting
        pusher.stop.set()
        consumer.stop.set()
        consumer.join(Consumer.IDLE + 30)
    with Client(zookeeper, cluster) as client:
        # Everything the topic holds (the live consumer read as much already, so all of it is out): the consumer
        # ends once no record came for 2 s.
        got = [(record.time, record.payload) for record in client.consume(group="check", timeout=2)]
    for records in (got, consumer.records):
        missing = as_multiset(expected) - as_multiset(records)
        extra = as_multiset(records) - as_multiset(expected)
        assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10], len(records), len(expected))


def _kill_9(data: Path, name: str) -> int:
    """kill -9 process ``name`` of the state file, and wait until the supervisor restarted it; one recovery."""
    restarts = _node(data, name)["restarts"]
    os.kill(_node(data, name)["pid"], signal.SIGKILL)
    eventually(lambda: _node(data, name)["restarts"] > restarts, f"{name} to be restarted")
    return 1


NODES = ["--nodes", "2", "--snapshot-interval-ms", "300"]
SEPARATE = [*NODES, "--placement", "separate"]
VICTIMS = {"node1": NODES, "node0": NODES, "worker1": SEPARATE, "front0": SEPARATE, "barrier0": SEPARATE,
           "acker": SEPARATE}


@pytest.mark.parametrize("victim", list(VICTIMS))
def test_kill_9_mid_stream_loses_and_duplicates_nothing(cluster_dir: Path, zookeeper: str, cluster_name: str,
                                                         victim: str) -> None:
    """Each node of ``up --nodes 2``, and each role of a process per role."""
    _kill_and_check(cluster_dir, zookeeper, cluster_name, VICTIMS[victim], lambda _store: _kill_9(cluster_dir, victim))
    status = cli("status", "--data-dir", str(cluster_dir))
    assert status.returncode == 0 and "restarts 1" in status.stdout, status.stdout


def _snapshot_being_written(snapshots: Path) -> Path | None:
    """A worker's ``.snap.tmp`` under any snapshot directory, or None. Retention prunes old directories while this
    polls, so a directory that vanishes between listing and reading is skipped (``glob`` raises on it)."""
    for directory in snapshots.iterdir():  # only boundary directories live here (``storage.snapshots``)
        with contextlib.suppress(FileNotFoundError):
            for tmp in directory.iterdir():
                if tmp.name.startswith("worker-") and tmp.name.endswith(".snap.tmp"):
                    return tmp
    return None


def test_kill_9_during_a_snapshot_write(cluster_dir: Path, zookeeper: str, cluster_name: str) -> None:
    """A worker dies while its ``.snap.tmp`` exists: that snapshot never completes, recovery starts from an older
    complete one (the torn file is never read), and the output is still exactly the oracle's."""
    snapshots = cluster_dir / "snapshots"

    def kill(store: ClusterStore) -> int:
        pids = {f"worker-{i}.snap.tmp": _node(cluster_dir, f"worker{i}")["pid"] for i in range(2)}
        deadline = time.monotonic() + 60
        torn: Path | None = None
        while torn is None:  # the file lives for a write and an fsync: polled tightly, killed at once
            assert time.monotonic() < deadline, "no snapshot write seen within 60 s"
            torn = _snapshot_being_written(snapshots)
            if torn is None:
                time.sleep(0.0005)
        os.kill(pids[torn.name], signal.SIGKILL)
        if not torn.exists():
            pytest.skip("the write finished between seeing its file and the kill")  # a race, not a failure
        ticks = len(store.ticks())
        eventually(lambda: _recovery_ticks(store, ticks) >= 1, "the recovery tick", timeout=120)
        start = next(tick["start"] for _, tick in store.ticks()[ticks:] if tick.get("recovery"))
        assert boundary_of(torn.parent.name) > GlobalTime(*start)  # the torn snapshot was not taken
        return 1

    _kill_and_check(cluster_dir, zookeeper, cluster_name,
                    ["--nodes", "2", "--snapshot-interval-ms", "100", "--placement", "separate"], kill)


@pytest.mark.parametrize("moment", ["registered", "published"])
def test_second_kill_while_recovering(cluster_dir: Path, zookeeper: str, cluster_name: str, moment: str) -> None:
    """worker1 dies; then, during the recovery, a second process: ``registered`` — the restarted worker1 again,
    as soon as it registered as recovering (before any recovery tick, while front0 is stopped); ``published`` —
    front0, as soon as the recovery tick is out (while the fronts re-send their logs), which takes a second
    recovery tick."""

    def kill(store: ClusterStore) -> int:
        ticks = len(store.ticks())
        first = _node(cluster_dir, "worker1")["pid"]
        if moment == "registered":
            # front0 held still until the second kill: the recovery tick needs every process of the tick to have
            # restarted, and the peers that restart on their own could otherwise all be back before worker1,
            # which then completes the roster and the tick is out before this test can look.
            front = _node(cluster_dir, "front0")["pid"]
            os.kill(front, signal.SIGSTOP)
            try:
                _kill_9(cluster_dir, "worker1")
                eventually(lambda: recovery.RECOVERING in store.members(WORKER).get("worker1", {}),
                           "the restarted worker1 registered as recovering")
                assert _recovery_ticks(store, ticks) == 0 and _node(cluster_dir, "worker1")["pid"] != first
                return _kill_9(cluster_dir, "worker1")
            finally:
                with contextlib.suppress(ProcessLookupError):  # the supervisor may have taken it for hung
                    os.kill(front, signal.SIGCONT)
        _kill_9(cluster_dir, "worker1")
        eventually(lambda: _recovery_ticks(store, ticks) >= 1, "the first recovery tick", timeout=120)
        return _kill_9(cluster_dir, "front0") + 1

    _kill_and_check(cluster_dir, zookeeper, cluster_name, SEPARATE, kill)


def test_zookeeper_stopped_for_5_s_mid_stream_loses_and_duplicates_nothing(tmp_path: Path, cluster_dir: Path,
                                                                         cluster_name: str) -> None:
    """Shorter than the session timeout: no session expires, and shorter than the fronts' stamping leases
    (``fronts/lease.py``), the only thing the stream needs ZooKeeper for: pushes go on meanwhile (at 1 s, the
    lease's old reach, they waited for ZooKeeper), and so does a consumer that commits every batch (its offsets
    were ZooKeeper nodes, and it waited in ``commit``); nothing is lost or twice."""
    server = ZooKeeperServer(tmp_path / "zookeeper")
    server.start()
    try:
        zookeeper = server.address
        up = cli("up", "--nodes", "2", "--data-dir", str(cluster_dir), "--zookeeper", zookeeper,
                 "--cluster", cluster_name)
        assert up.returncode == 0, up.stdout + up.stderr
        assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper,
                   "--cluster", cluster_name).returncode == 0
        pusher = Pusher(zookeeper, cluster_name, lines(), 0.02, retries=40)
        consumer = Consumer(zookeeper, cluster_name)
        pusher.start()
        consumer.start()
        eventually(lambda: pusher.pushed >= 100 and len(consumer.records) >= 100, "a running stream, consumed")
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGSTOP)
        time.sleep(2)  # past a 1 s lease
        stopped, read = pusher.pushed, len(consumer.records)
        time.sleep(3)
        during, read_during = pusher.pushed - stopped, len(consumer.records) - read
        os.killpg(server.pid, signal.SIGCONT)
        assert during >= 30, f"{during} events pushed in the last 3 s of the pause"  # ~200 when not held
        assert read_during >= 7 * 30, f"{read_during} records consumed in the last 3 s of the pause"
        resumed = pusher.pushed
        eventually(lambda: pusher.pushed >= resumed + 100 or pusher.error is not None, "pushes after ZooKeeper")
        pusher.stop.set()
        pusher.join(60)
        assert pusher.error is None, pusher.error
        assert "recovering" not in (cluster_dir / "logs" / "node0.log").read_text()  # no restart was needed
        expected = run_oracle(wordcount.graph(), read_input_logs(cluster_dir))[0]
        assert len(expected) == 7 * pusher.pushed
        consumer.target = len(expected)
        eventually(lambda: len(consumer.records) >= len(expected) or not consumer.is_alive(), "the live consumer")
        consumer.join(30)
        assert consumer.error is None, consumer.error
        with Client(zookeeper, cluster_name) as client:
            got = [(record.time, record.payload) for record in client.consume(group="check", timeout=10)]
        for records in (got, consumer.records):
            assert as_multiset(records) == as_multiset(expected)
        assert cli("down", "--data-dir", str(cluster_dir)).returncode == 0
    finally:
        server.stop()
