"""A node's clean stop ends, and ends the process, whatever it waits for (``Node.stop``, ``stop_limit``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flamestream.coordinator.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_a_node_stopped_while_zookeeper_is_paused_exits_0_without_waiting_for_the_heartbeat(tmp_path: Path) -> None:
    """Before: the session close (and threads blocked in ZooKeeper calls) held the exit until kazoo's heartbeat
    failed, 6.3 s; a call left unanswered by the close could hold it for good."""
    server = ZooKeeperServer(tmp_path / "zookeeper")
    server.start()
    try:
        node = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--zookeeper", server.address,
                                 "--cluster", "stop", "--name", "n", "--worker", "0"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert node.stdout is not None
        assert node.stdout.readline().split()[:2] == ["ready", "n"]
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGSTOP)
        try:
            node.terminate()
            _, err = node.communicate(timeout=60)
        finally:
            os.killpg(server.pid, signal.SIGCONT)
    finally:
        server.stop()
    assert node.returncode == 0, err
    assert "ZooKeeper did not answer the session close within 2 s" in err, err
    assert "stopped" in err
    assert "outstanding heartbeat ping not received" not in err, err  # it exited before kazoo gave up


HUNG = """
import asyncio, sys, time
from flamestream.runtime.node import stop_limit

async def main() -> None:
    async def stuck() -> None:
        await asyncio.sleep(60)
    async with stop_limit(0.5):
        if sys.argv[1] == "awaiting":
            await asyncio.create_task(stuck(), name="a stuck close")
        else:
            time.sleep(60)  # the event loop itself blocked

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["awaiting", "blocked"])
def test_a_stop_that_hangs_exits_1_showing_where(how: str) -> None:
    done = subprocess.run([sys.executable, "-c", HUNG, how], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    if how == "awaiting":  # the loop's watchdog names the task awaited and where it waits
        assert "the stop did not end within 0.5 s" in done.stderr, done.stderr
        assert "name='a stuck close'" in done.stderr and "line 7, in stuck" in done.stderr, done.stderr
    else:  # faulthandler's thread shows the main thread blocked in the sleep
        assert "Timeout (0:00:01.500000)!" in done.stderr and "line 12 in main" in done.stderr, done.stderr
