"""The acker service as a real process: acks and reports move the min time its watchers see.

Also home of the helpers that start service processes and publish ticks
(``tests/test_barrier_service.py`` uses them too).
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from examples import wordcount
from flamestream.cluster import ClusterStore
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RPC_TIMEOUT = 15.0


@dataclass
class Service:
    process: subprocess.Popen[str]
    address: str


@contextlib.contextmanager
def running(name: str, args: list[str], stderr_path: Path) -> Iterator[Service]:
    """Run ``flamestream node --name name args`` until its ``ready`` line; on exit SIGTERM it and require exit
    code 0."""
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "flamestream", "node", "--name", name, *args], cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
        assert process.stdout is not None
        try:
            ready, _, _ = select.select([process.stdout], [], [], 30.0)
            line = process.stdout.readline() if ready else ""
            assert line.startswith(f"ready {name} "), \
                f"{name} printed {line!r} instead of a ready line:\n{stderr_path.read_text()}"
            yield Service(process, line.split()[2])
        finally:
            if process.poll() is None:
                process.terminate()
            try:
                code = process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
    assert code == 0, f"{name} exited with {code}:\n{stderr_path.read_text()}"


def publish_tick(zookeeper: str, cluster: str, *, fronts: tuple[int, ...], start_ts: int, acker: str,
                 barriers: tuple[tuple[int, str], ...] = (), previous: int | None = None,
                 recovery: bool = False) -> int:
    tick = Tick(number=0, start=GlobalTime(start_ts, 0), graph=wordcount.graph().to_dict(), layout=Layout.even(1),
                workers=("127.0.0.1:1",), fronts=fronts, acker=acker, barriers=barriers, previous=previous,
                recovery=recovery)
    with ClusterStore(zookeeper, cluster=cluster) as store:
        return store.publish_tick(tick.to_dict())


def ack(ts: int, front: int, xor: int) -> pb.Ack:
    return pb.Ack(ts=ts, front=front, xor=xor)


def report(front: int, ts: int, tick: int = 0) -> pb.AckBatch:
    return pb.AckBatch(report=pb.Report(front=front, ts=ts), tick=tick)


def send(stub: pb_grpc.AckerStub, messages: Iterable[pb.AckBatch]) -> None:
    """One Ack stream carrying ``messages``; it returns once the acker has applied them all."""
    stub.Ack(iter(messages), timeout=RPC_TIMEOUT)


def read_until(watch: Iterator[pb.GlobalTime], target: GlobalTime) -> list[GlobalTime]:
    """Min times from ``watch`` up to and including ``target``; they must only grow on the way."""
    seen: list[GlobalTime] = []
    while not seen or seen[-1] != target:
        message = next(watch)
        seen.append(GlobalTime(message.ts, message.front))
        assert seen == sorted(seen) and seen[-1] <= target, f"min times went {seen}, expected to reach {target}"
    return seen


def test_min_time_follows_acks_and_reports(zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with running("acker", args, tmp_path / "acker.err") as acker, grpc.insecure_channel(acker.address) as channel:
        stub = pb_grpc.AckerStub(channel)
        # A sender that saw the tick first: its acks wait for the acker's tick instead of being lost.
        early = threading.Thread(target=send, args=(stub, [pb.AckBatch(acks=[ack(120, 1, 0xBEEF)], tick=0)]))
        early.start()
        watch = stub.WatchMinTime(pb.Empty(), timeout=60)  # opened before any tick: waits for the first one
        publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=100, acker=acker.address)
        early.join(60)
        assert read_until(watch, GlobalTime(100, 0)) == [GlobalTime(100, 0)]
        # The reports move the min time to (120, 1), where the early ack holds it, but nothing completed there:
        # no watcher could release or trim anything by it, so it is not sent.  Completing (120, 1) is.
        send(stub, [report(0, 130), report(1, 130)])
        send(stub, [pb.AckBatch(acks=[ack(120, 1, 0xBEEF)], tick=0)])
        assert read_until(watch, GlobalTime(130, 0)) == [GlobalTime(130, 0)]

        # An unmatched ack at (150, 0) holds the min time although both fronts promise 200; (140, 0) completing
        # moves it there.
        send(stub, [pb.AckBatch(acks=[ack(150, 0, 0xDEAD), ack(140, 0, 3)], report=pb.Report(front=0, ts=200), tick=0),
                    report(1, 200), pb.AckBatch(acks=[ack(140, 0, 3)], tick=0)])
        assert read_until(watch, GlobalTime(150, 0)) == [GlobalTime(150, 0)]
        send(stub, [pb.AckBatch(acks=[ack(150, 0, 0xDEAD)], tick=0)])  # the matching receive ack
        assert read_until(watch, GlobalTime(200, 0)) == [GlobalTime(200, 0)]

        # A send and its receive in one message cancel out and never hold the min time.
        send(stub, [pb.AckBatch(acks=[ack(250, 1, 7), ack(250, 1, 7)], report=pb.Report(front=0, ts=300), tick=0),
                    report(1, 300)])
        assert GlobalTime(250, 1) not in read_until(watch, GlobalTime(300, 0))

        late = stub.WatchMinTime(pb.Empty(), timeout=60)
        assert read_until(late, GlobalTime(300, 0)) == [GlobalTime(300, 0)]  # a new watcher starts at the current

        # A new tick brings a fresh table for its fronts and start time.
        publish_tick(zookeeper, cluster_name, fronts=(0, 1, 2), start_ts=1000, acker=acker.address)
        assert read_until(watch, GlobalTime(1000, 0))[-1] == GlobalTime(1000, 0)
        send(stub, [pb.AckBatch(acks=[ack(1050, 0, 9), ack(1050, 0, 9)], tick=1), report(0, 1100, 1),
                    report(1, 1100, 1)])
        assert read_until(watch, GlobalTime(1000, 2))[-1] == GlobalTime(1000, 2)
        watch.cancel()
        late.cancel()


def test_slow_watcher_skips_to_the_latest_and_holds_back_no_one(zookeeper: str, cluster_name: str,
                                                                tmp_path: Path) -> None:
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    # A tiny flow-control window (and no window growth) makes the slow watcher's stream block after a few values.
    tiny_window = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    with (running("acker", args, tmp_path / "acker.err") as acker, grpc.insecure_channel(acker.address) as channel,
          grpc.insecure_channel(acker.address, options=tiny_window) as slow_channel):
        stub = pb_grpc.AckerStub(channel)
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=0, acker=acker.address)
        slow = pb_grpc.AckerStub(slow_channel).WatchMinTime(pb.Empty(), timeout=60)  # not read until the end
        fast = stub.WatchMinTime(pb.Empty(), timeout=60)
        assert read_until(fast, GlobalTime(0, 0)) == [GlobalTime(0, 0)]
        changes = 3000  # each completes a global time and moves the min time past it
        send(stub, (pb.AckBatch(acks=[ack(ts - 1, 0, 5), ack(ts - 1, 0, 5)], report=pb.Report(front=0, ts=ts), tick=0)
                    for ts in range(1, changes + 1)))
        assert read_until(fast, GlobalTime(changes, 0))[-1] == GlobalTime(changes, 0)
        # The slow watcher gets what its window held, then jumps to the latest value.
        assert len(read_until(slow, GlobalTime(changes, 0))) < changes // 2
        slow.cancel()
        fast.cancel()


def test_a_recovery_tick_starts_an_empty_table_even_when_it_names_the_running_tick_as_previous(
        zookeeper: str, cluster_name: str, tmp_path: Path) -> None:
    """A recovery tick's ``previous`` is the tick whose snapshot it starts from, not a hand-over: a table carried
    into it would keep the crashed tick's stuck times (here (150, 0)) and its fronts' reports."""
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with running("acker", args, tmp_path / "acker.err") as acker, grpc.insecure_channel(acker.address) as channel:
        stub = pb_grpc.AckerStub(channel)
        crashed = publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=100, acker=acker.address)
        watch = stub.WatchMinTime(pb.Empty(), timeout=RPC_TIMEOUT)
        send(stub, [pb.AckBatch(acks=[ack(150, 0, 0xDEAD), ack(140, 0, 3), ack(140, 0, 3)], tick=0), report(0, 200),
                    report(1, 200)])
        assert read_until(watch, GlobalTime(150, 0))[-1] == GlobalTime(150, 0)
        watch.cancel()
        publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=120, acker=acker.address, previous=crashed,
                     recovery=True)
        deadline = time.monotonic() + RPC_TIMEOUT
        while True:  # a new watcher starts at the current min time: the recovery tick's start once it is taken
            first = next(stub.WatchMinTime(pb.Empty(), timeout=RPC_TIMEOUT))
            if GlobalTime(first.ts, first.front) != GlobalTime(150, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert GlobalTime(first.ts, first.front) == GlobalTime(120, 0)
        watch = stub.WatchMinTime(pb.Empty(), timeout=RPC_TIMEOUT)
        send(stub, [pb.AckBatch(acks=[ack(130, 1, 7), ack(130, 1, 7)], tick=1), report(0, 300, 1), report(1, 300, 1)])
        assert read_until(watch, GlobalTime(300, 0))[-1] == GlobalTime(300, 0)  # (150, 0) is gone with the table
        watch.cancel()


def test_acks_wait_for_their_tick_and_those_of_a_replaced_table_are_dropped(zookeeper: str, cluster_name: str,
                                                                            tmp_path: Path) -> None:
    """A front that takes a fresh tick up before the acker does sends acks of that tick early: applied to the old
    table they would be dropped with it, and the matching acks, applied to the new one, would hold the min time
    for good.  A late batch of the old tick must not reach the new table either."""
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with running("acker", args, tmp_path / "acker.err") as acker, grpc.insecure_channel(acker.address) as channel:
        stub = pb_grpc.AckerStub(channel)
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=100, acker=acker.address)
        watch = stub.WatchMinTime(pb.Empty(), timeout=RPC_TIMEOUT)
        assert read_until(watch, GlobalTime(100, 0)) == [GlobalTime(100, 0)]
        handed = threading.Event()

        def early_batch() -> Iterator[pb.AckBatch]:
            yield pb.AckBatch(acks=[ack(1010, 0, 0xA)], tick=1)  # a send ack of tick 1, which is not out yet
            handed.set()

        early = threading.Thread(target=send, args=(stub, early_batch()))
        early.start()
        assert handed.wait(RPC_TIMEOUT)
        time.sleep(0.3)  # the batch reaches the acker before the tick does (without waiting it would be applied)
        assert early.is_alive(), "a batch of a tick the acker has not seen must wait for it"
        publish_tick(zookeeper, cluster_name, fronts=(0,), start_ts=1000, acker=acker.address)
        early.join(RPC_TIMEOUT)
        assert not early.is_alive()
        send(stub, [pb.AckBatch(acks=[ack(1020, 0, 0xB)], tick=0)])  # late, from tick 0: its table is gone
        send(stub, [pb.AckBatch(acks=[ack(1010, 0, 0xA)], report=pb.Report(front=0, ts=2000), tick=1)])
        # (1010, 0) completes in the new table and nothing of tick 0 is in it, so the min time reaches the promise.
        assert read_until(watch, GlobalTime(2000, 0))[-1] == GlobalTime(2000, 0)
        watch.cancel()


def test_bad_reports_are_rejected_and_the_acker_keeps_serving(zookeeper: str, cluster_name: str,
                                                              tmp_path: Path) -> None:
    args = ["--zookeeper", zookeeper, "--cluster", cluster_name, "--acker"]
    with running("acker", args, tmp_path / "acker.err") as acker, grpc.insecure_channel(acker.address) as channel:
        stub = pb_grpc.AckerStub(channel)
        publish_tick(zookeeper, cluster_name, fronts=(0, 1), start_ts=10, acker=acker.address)
        watch = stub.WatchMinTime(pb.Empty(), timeout=60)
        assert read_until(watch, GlobalTime(10, 0)) == [GlobalTime(10, 0)]
        with pytest.raises(grpc.RpcError) as unknown:
            send(stub, [pb.AckBatch(acks=[ack(15, 0, 3)], report=pb.Report(front=7, ts=99), tick=0)])
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "front 7" in (unknown.value.details() or "")
        # Still serving, and the rejected message left no trace: its ack at (15, 0) would hold the min time.
        send(stub, [pb.AckBatch(acks=[ack(12, 0, 5), ack(12, 0, 5)], tick=0), report(0, 20), report(1, 20)])
        assert read_until(watch, GlobalTime(20, 0))[-1] == GlobalTime(20, 0)
        watch.cancel()
