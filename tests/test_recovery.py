"""Crash recovery for real: kill -9 a node mid-stream; the supervisor restarts it, the cluster recovers from its
last complete snapshot, and the topic still holds exactly the oracle's output (issue #11).

The pushes go on through the crash with an idempotent producer: a push in
flight when its front died is retried with the same sequence numbers and
admitted once (``Pusher`` pushes as producer "steady").
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream import run_oracle
from flamestream.client import Client
from flamestream.cluster import ClusterStore
from flamestream.coordinator.zookeeper import ZooKeeperServer
from flamestream.storage.input_log import read_input_logs
from tests.test_cluster_e2e import as_multiset, cli
from tests.test_handover_cluster import Pusher, lines
from tests.test_nodes import eventually

pytestmark = pytest.mark.slow



def _state(data: Path) -> dict[str, Any]:
    return json.loads((data / "cluster.json").read_text())  # type: ignore[no-any-return]


def _node(data: Path, name: str) -> dict[str, Any]:
    return next(p for p in _state(data)["processes"] if p["name"] == name)


@pytest.mark.parametrize("victim", ["node1", "node0"])
def test_kill_9_of_a_node_mid_stream_loses_and_duplicates_nothing(cluster_dir: Path, zookeeper: str, cluster_name: str,
                                                                   victim: str) -> None:
    up = cli("up", "--nodes", "2", "--snapshot-interval-ms", "300", "--data-dir", str(cluster_dir),
             "--zookeeper", zookeeper, "--cluster", cluster_name)
    assert up.returncode == 0, up.stdout + up.stderr
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster_name).returncode == 0
    pusher = Pusher(zookeeper, cluster_name, lines(), 0.02, retries=40)  # rides out a recovery
    pusher.start()
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        eventually(lambda: pusher.pushed >= 300 and any(store.complete_snapshots(n, 2) for n, _ in store.ticks()),
                   "a complete snapshot of a running stream")
        ticks = len(store.ticks())
        os.kill(_node(cluster_dir, victim)["pid"], signal.SIGKILL)
        # Positive signals: the supervisor restarted it, and a recovery tick was published.
        eventually(lambda: _node(cluster_dir, victim)["restarts"] >= 1, f"{victim} to be restarted")
        eventually(lambda: any(t.get("recovery") for _, t in store.ticks()[ticks:]), "the recovery tick")
    pushed_after = pusher.pushed
    eventually(lambda: pusher.pushed >= pushed_after + 200 or pusher.error is not None, "pushes after recovery")
    pusher.stop.set()
    pusher.join(60)
    assert pusher.error is None, pusher.error
    expected = run_oracle(wordcount.graph(), read_input_logs(cluster_dir))[0]
    assert len(expected) == 7 * pusher.pushed  # every acknowledged push is in the input logs, once
    with Client(zookeeper, cluster_name) as client:
        # Everything the topic holds: the consumer ends once no record came for 10 s (after the last one).
        got = [(record.time, record.payload) for record in client.consume(group="check", timeout=10)]
    missing = as_multiset(expected) - as_multiset(got)
    extra = as_multiset(got) - as_multiset(expected)
    assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10], len(got), len(expected))
    status = cli("status", "--data-dir", str(cluster_dir))
    assert status.returncode == 0 and "restarts 1" in status.stdout, status.stdout


def test_zookeeper_stopped_for_5_s_mid_stream_loses_and_duplicates_nothing(tmp_path: Path, cluster_dir: Path,
                                                                         cluster_name: str) -> None:
    """Shorter than the session timeout: no session expires, the stream needs ZooKeeper only for the fronts'
    stamping leases (pushes wait, the SDK retries), and everything goes on once it is back."""
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
        pusher.start()
        eventually(lambda: pusher.pushed >= 100, "a running stream")
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGSTOP)
        time.sleep(5)
        os.killpg(server.pid, signal.SIGCONT)
        resumed = pusher.pushed
        eventually(lambda: pusher.pushed >= resumed + 100 or pusher.error is not None, "pushes after ZooKeeper")
        pusher.stop.set()
        pusher.join(60)
        assert pusher.error is None, pusher.error
        assert "recovering" not in (cluster_dir / "logs" / "node0.log").read_text()  # no restart was needed
        expected = run_oracle(wordcount.graph(), read_input_logs(cluster_dir))[0]
        assert len(expected) == 7 * pusher.pushed
        with Client(zookeeper, cluster_name) as client:
            got = [(record.time, record.payload) for record in client.consume(group="check", timeout=10)]
        assert as_multiset(got) == as_multiset(expected)
        assert cli("down", "--data-dir", str(cluster_dir)).returncode == 0
    finally:
        server.stop()
