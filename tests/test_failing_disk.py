"""A front whose input log's fsync fails, on a real cluster (issue #13: the front sends a push's events to the
workers while its log syncs, so a failed fsync leaves events at the workers that are not durable).

The front's disk is ``tests/faultfs.py``: the kernel's fsync answers EIO while the test says so.  What must hold:
the push is not acknowledged, nothing of it is released while it is not durable (the front held its reports, the
acker never heard of it), the node stops and is restarted, and once the disk heals the recovery replays what the
log holds; the client's retries (the same producer and sequences) end in one admission.  The topic is then exactly
the oracle's output over the input log, which holds every line once, in push order.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream.client import Client
from flamestream.runtime.launcher import is_alive
from flamestream.spark.audit import topic_records
from flamestream.storage.input_log import read_input_logs
from tests.disks import failing_fsync
from tests.test_cluster_e2e import Cluster, as_multiset, consume_all, expected_from_input_logs, running
from tests.test_nodes import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FAILURE = "input log failed to sync"
"""What the front's node logs when it stops for a push it could not make durable (``FrontService._send_durably``)."""


def _node(cluster: Cluster) -> dict[str, Any]:
    return next(p for p in cluster.state()["processes"] if str(p["name"]).startswith("node"))


def _released(data: Path) -> set[str]:
    """The words of the records the output topic holds, read from its files (the node may be down meanwhile)."""
    return {payload["word"] for _time, payload in topic_records(data)}


def test_the_failing_disk_fails_fsync_only_when_told_and_keeps_what_was_written(tmp_path: Path) -> None:
    with failing_fsync(tmp_path / "disk", tmp_path) as disk:
        path = disk.mount / "log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, b"synced")
            os.fsync(fd)
            disk.fail()
            os.write(fd, b" written")
            with pytest.raises(OSError) as failed:
                os.fsync(fd)
            assert failed.value.errno == errno.EIO
            directory = os.open(disk.mount, os.O_RDONLY)
            try:
                with pytest.raises(OSError):
                    os.fsync(directory)
                disk.heal()
                os.fsync(directory)
            finally:
                os.close(directory)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert path.read_bytes() == (tmp_path / "faultfs-files" / "log").read_bytes() == b"synced written"
        os.rename(path, disk.mount / "renamed")
        os.truncate(disk.mount / "renamed", 6)
        assert os.listdir(disk.mount) == ["renamed"] and (disk.mount / "renamed").read_bytes() == b"synced"


def test_a_failed_fsync_stops_the_front_and_the_recovery_keeps_every_event_once(tmp_path: Path, zookeeper: str,
                                                                               cluster_name: str) -> None:
    data = tmp_path / "cluster"
    with (failing_fsync(data / "input", tmp_path) as disk,
          running(data, zookeeper, cluster_name, "--nodes", "1") as cluster):
        cluster.deploy("examples/wordcount.py")
        log = data / "logs" / f"{_node(cluster)['name']}.log"
        before = [f"early{i} shared" for i in range(20)]
        failed = [f"lost{i} shared" for i in range(20)]
        after = [f"late{i} shared" for i in range(20)]
        with Client(zookeeper, cluster_name, retries=60) as client:  # rides out the restarts
            client.push(before, producer="fsync")
            consume_all(client, "before", 40, timeout=60)  # released: the cluster works on this disk
            node = _node(cluster)
            disk.fail()
            with ThreadPoolExecutor(1) as pusher:
                retried = pusher.submit(client.push, failed, producer="fsync")  # retried until the node is back
                try:
                    eventually(lambda: FAILURE in log.read_text(), "the front to stop for the failed fsync")
                    # While the disk fails, the node's restarts stop at the log's open (which syncs the log's
                    # tail): once the failed process is gone, what the topic holds is what it holds until the disk
                    # heals.
                    eventually(lambda: (_node(cluster)["restarts"] > node["restarts"]
                                        and not is_alive(node["pid"], node["started"])),
                               "the supervisor to restart the node")
                    released = _released(data)
                    assert {f"early{i}" for i in range(20)} <= released
                    assert not released & {f"lost{i}" for i in range(20)}, "released before it was durable"
                    assert not retried.done(), "the push was acknowledged although its events are not durable"
                finally:
                    disk.heal()  # else the push's retries hold the executor's exit for their whole back-off
                retried.result(timeout=120)  # the same producer and sequences: admitted once
            client.push(after, producer="fsync")
            logged = [stamped[3] for stamped in read_input_logs(data)]
            assert logged == before + failed + after  # every line once, in push order
            expected = expected_from_input_logs(cluster, wordcount.graph())
            got = consume_all(client, "check", len(expected), timeout=120)
        assert as_multiset(topic_records(data)) == as_multiset(expected)  # nothing twice, beyond what was consumed
        assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
        assert len(expected) == 2 * len(logged)
