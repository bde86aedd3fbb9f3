"""Bounded resources on a real cluster (issue #12 part 4): amplification, names and sequences, a full disk.

Slow: each test starts nodes with ``flamestream up`` against the session's ZooKeeper.  The pure-core side (the
output cap in the oracle and the local runtime) is ``test_limits.py``.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from examples import wordcount
from flamestream.client import Client, ClientError
from flamestream.cluster import ClusterStore
from flamestream.core.dead_letter import is_dead_letter
from flamestream.core.limits import RETRY_HINT
from flamestream.core.meta import boundary_of
from flamestream.core.oracle import oracle_state
from flamestream.storage.input_log import read_input_logs
from flamestream.storage.snapshots import read_snapshot
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.workers.service import MAX_SNAPSHOT_STRIDE
from tests.disks import tmpfs
from tests.test_cluster_e2e import Cluster, as_multiset, cli, consume_all, expected_from_input_logs
from tests.test_handover import flatten
from tests.test_limits import wordcount as wordcount_graph
from tests.test_nodes import eventually, health

pytestmark = pytest.mark.timeout(600)

RSS_BOUND_KB = 1_500_000
"""What a node may grow to while 100 events of 400 KB go through word count: the outside tester saw 6.1 GB."""


def _up(data: Path, zookeeper: str, cluster: str, *args: str) -> Cluster:
    done = cli("up", *args, "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    return Cluster(data, zookeeper, cluster)



def rss_kb(cluster: Cluster) -> dict[str, int]:
    """VmRSS of every node process (``DIR/cluster.json``), by name."""
    out = {}
    for p in cluster.state()["processes"]:
        status = Path(f"/proc/{p['pid']}/status")
        if p["name"].startswith("node") and status.exists():
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
            out[p["name"]] = int(line.split()[1])
    return out


def big_line(rng: random.Random, size: int) -> str:
    words = []
    total = 0
    while total < size:
        word = f"w{rng.randrange(50_000)}"
        words.append(word)
        total += len(word) + 1
    return " ".join(words)


def front_stub(cluster: Cluster) -> tuple[grpc.Channel, Any]:
    channel = cluster.channel(cluster.address("front"), options=[
        ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
    return channel, rpc.FrontStub(channel)


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def event(payload: Any, producer: str = "", sequence: int = 0) -> pb.Event:
    return pb.Event(payload=json.dumps(payload).encode(), producer=producer, sequence=sequence)


def test_amplification_is_cut_and_memory_stays_bounded(cluster_dir: Path, zookeeper: str, cluster_name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster = _up(cluster_dir, zookeeper, cluster_name, "--nodes", "2")
    cluster.deploy("examples/wordcount.py")
    rng = random.Random(12)
    lines = [big_line(rng, 400_000) for _ in range(100)]  # ~57,000 words each, the cap is 10,000 outputs
    before = rss_kb(cluster)
    channel, stub = front_stub(cluster)
    with channel:
        # The tester's request: 100 events of 400 KB in one Push, 40 MB in all.
        code, details = code_of(lambda: stub.Push(pb.PushRequest(events=[event(x) for x in lines]), timeout=60))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-push-bytes" in details, details
    peak: dict[str, int] = dict(before)
    with cluster.client() as client:
        client.push(lines)  # the SDK splits by bytes: 4 MB per request
        small = [f"the dog {i % 7} saw the cat {i % 3}" for i in range(200)]
        client.push(small)
        expected = expected_from_input_logs(cluster, wordcount.graph())
        assert len(expected) == 100 + sum(len(x.split()) for x in small)
        got: list[Any] = []
        deadline = time.monotonic() + 240
        while len(got) < len(expected) and time.monotonic() < deadline:
            got += consume_all(client, "amplified", len(expected) - len(got), timeout=10)
            for name, kb in rss_kb(cluster).items():
                peak[name] = max(peak.get(name, 0), kb)
    after = rss_kb(cluster)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    dead = [r.payload["dead_letter"] for r in got if is_dead_letter(r.payload)]
    assert len(dead) == 100 and all("more than 10000 outputs" in d["error"] for d in dead)
    assert max(r.payload["count"] for r in got if not is_dead_letter(r.payload) and r.payload["word"] == "the") == 400
    with capsys.disabled():
        print(f"\nRSS kB before {before}, peak {peak}, after {after}")
    assert max(peak.values()) < RSS_BOUND_KB, peak


def test_producer_ids_sequences_and_group_names_are_bounded(cluster_dir: Path, zookeeper: str,
                                                            cluster_name: str) -> None:
    cluster = _up(cluster_dir, zookeeper, cluster_name, "--nodes", "1")
    cluster.deploy("examples/wordcount.py")
    channel, stub = front_stub(cluster)
    with channel:
        push = stub.Push

        def refused(*events: pb.Event) -> str:
            code, details = code_of(lambda: push(pb.PushRequest(events=list(events)), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            return details

        assert "longer than 256 bytes" in refused(event("a"), event("b", "p" * 257, 1))
        assert "reserved" in refused(event("a", "~anon-someone-elses-0", 1))
        assert "above the largest allowed" in refused(event("a", "seq", 2**64 - 1))
        assert "above the largest allowed" in refused(event("a", "seq", 2**63))
        ok = push(pb.PushRequest(events=[event("a b", "p" * 256, 1), event("c", "seq", 2**63 - 1)]), timeout=30)
        assert list(ok.admitted) == [True, True]
        again = push(pb.PushRequest(events=[event("c", "seq", 2**63 - 1), event("d", "seq", 5)]), timeout=30)
        assert list(again.admitted) == [False, False]  # retries, answered with their times
    barrier = cluster.channel(cluster.address("barrier"), options=[
        ("grpc.max_send_message_length", 64 << 20)])
    with barrier:
        stub_b = rpc.BarrierStub(barrier)
        for group in ("g" * 2_000_000, "a/b", "..", "sp ace"):
            code, details = code_of(lambda group=group: stub_b.Commit(
                pb.CommitRequest(group=group, partition=0, offset=0), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            code, _ = code_of(lambda group=group: stub_b.Committed(
                pb.CommittedRequest(group=group, partition=0), timeout=30))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
    with cluster.client() as client:  # the barrier kept its ZooKeeper session: consuming and committing work
        records = consume_all(client, "after-bad-names", 3, timeout=30)
        assert sorted(r.payload["word"] for r in records) == ["a", "b", "c"]
        assert client.committed("after-bad-names", 0) == 3


@contextlib.contextmanager
def _tmpfs(data: Path, under: str, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``data/under`` for the block (needs root); ``data`` is yielded, and its cluster is
    taken down first if one was started there."""
    with tmpfs(data / under, size):
        try:
            yield data
        finally:
            if (data / "cluster.json").exists():
                cli("down", "--data-dir", str(data))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs at DIR/input, where the front keeps its input log."""
    with _tmpfs(tmp_path / "cluster", "input", "4m") as data:
        yield data


@pytest.fixture
def small_topic_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs at DIR/topic, where the barrier keeps the output topic."""
    with _tmpfs(tmp_path / "cluster", "topic", "2m") as data:
        yield data


def test_a_full_disk_refuses_pushes_and_recovers(small_disk: Path, zookeeper: str, cluster_name: str) -> None:
    cluster = _up(small_disk, zookeeper, cluster_name, "--nodes", "1")
    cluster.deploy("examples/wordcount.py")
    filler = small_disk / "input" / "filler"
    with open(filler, "wb") as f:  # leave ~0.5 MB: the input log fills after a few hundred lines
        f.write(b"\0" * (3 * 1024 * 1024 + 512 * 1024))
    node = next(p for p in cluster.state()["processes"] if p["name"].startswith("node"))
    pushed: list[str] = []
    refused: ClientError | None = None
    with Client(zookeeper, cluster_name, retries=1) as client:
        for batch in range(200):
            lines = [f"line {batch} {i} " + "pad " * 200 for i in range(20)]
            try:
                client.push(lines, producer="disk")
            except ClientError as exc:
                refused = exc
                break
            pushed += lines
        assert refused is not None and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert "disk full" in str(refused)
        assert Path(f"/proc/{node['pid']}").exists(), "the front's node must survive a full disk"
        logged = [r[3] for r in read_input_logs(small_disk)]
        assert logged[:len(pushed)] == pushed  # every acknowledged event is durable, once, in order
        assert len(logged) - len(pushed) < 20  # at most a prefix of the refused batch reached the log
        filler.unlink()  # space returns: the same batch again (same producer sequences) is admitted once
        client.push(lines, producer="disk")
        pushed += lines
        assert [r[3] for r in read_input_logs(small_disk)] == pushed
        expected = expected_from_input_logs(cluster, wordcount.graph())
        got = consume_all(client, "disk", len(expected), timeout=120)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    assert len(expected) == sum(len(x.split()) for x in pushed)


def test_a_full_topic_disk_pauses_releases_until_space_returns(small_topic_disk: Path, zookeeper: str,
                                                                cluster_name: str) -> None:
    """The barrier's disk fills while the fronts' does not: the barrier holds its records back (logged), pushes
    still succeed (their events are durable), subscribers read what is out; once space returns the held records
    follow, and the topic is exactly the oracle's output, with no node restarted."""
    data = small_topic_disk
    cluster = _up(data, zookeeper, cluster_name, "--nodes", "1")
    cluster.deploy("examples/wordcount.py")
    filler = data / "topic" / "filler"
    with open(filler, "wb") as f:  # leave ~200 KB: a thousand or so word-count records
        f.write(b"\0" * (1024 * 1024 + 800 * 1024))
    node = next(p for p in cluster.state()["processes"] if p["name"].startswith("node"))
    log = data / "logs" / f"{node['name']}.log"
    rng = random.Random(7)
    pushed: list[str] = []
    with Client(zookeeper, cluster_name) as client:
        for _ in range(100):
            lines = [" ".join(f"w{rng.randrange(2000)}" for _ in range(30)) for _ in range(20)]
            client.push(lines, producer="topic-disk")
            pushed += lines
            if "disk full: partition 0 holds" in log.read_text():
                break
        assert "disk full: partition 0 holds" in log.read_text(), "the topic never filled"
        out_before = sum(1 for _ in client.consume(group="early", timeout=3))  # what is out stays readable
        filler.unlink()
        eventually(lambda: "space returned: partition 0 releases again" in log.read_text(), "releases to resume")
        expected = expected_from_input_logs(cluster, wordcount.graph())
        assert 0 < out_before < len(expected)
        got = consume_all(client, "topic-disk", len(expected), timeout=120)
    assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
    assert len(expected) == 30 * len(pushed)
    assert Path(f"/proc/{node['pid']}").exists()
    assert [p.get("restarts", 0) for p in cluster.state()["processes"]] == [0] * len(cluster.state()["processes"])


def test_a_full_snapshot_disk_turns_the_worker_not_serving_until_a_snapshot_succeeds(
        tmp_path: Path, zookeeper: str, cluster_name: str) -> None:
    """Snapshots that cannot be written leave the stream running (NOT_SERVING says why); once space returns
    the next snapshot, rebuilt from the whole state, completes, the worker is SERVING again, and the output is
    exactly the oracle's."""
    with _tmpfs(tmp_path / "cluster", "snapshots", "1m") as data:
        filler = data / "snapshots" / "filler"
        filler.write_bytes(b"\0" * (1024 * 1024))  # nothing left
        cluster = _up(data, zookeeper, cluster_name, "--nodes", "1", "--snapshot-interval-ms", "200")
        cluster.deploy("examples/wordcount.py")
        node = next(p for p in cluster.state()["processes"] if p["name"].startswith("node"))
        with Client(zookeeper, cluster_name) as client, ClusterStore(zookeeper, cluster=cluster_name) as store:
            client.push([f"a b c {i}" for i in range(50)], producer="snap")
            pushed = 0

            def turns(status: str) -> Callable[[], bool]:
                def check() -> bool:  # an idle single-front stream's min time rests: snapshots need input
                    nonlocal pushed
                    client.push([f"f {pushed}"], producer="snap-more")
                    pushed += 1
                    return health(node["address"], "worker0", cluster.state()["tls_dir"]) == status
                return check

            eventually(turns("NOT_SERVING"), "worker0 to turn NOT_SERVING over its failed snapshot")
            status = cli("status", "--data-dir", str(data)).stdout  # alive, but not serving: status says so
            assert re.search(rf"^{node['name']} +node +{node['pid']} +NOT_SERVING ", status, re.M), status
            client.push([f"d e {i}" for i in range(50)], producer="snap")  # the stream goes on meanwhile
            filler.unlink()
            eventually(turns("SERVING"), "worker0 to be SERVING again")
            tick = store.ticks()[-1][0]
            (boundary, *_) = eventually(lambda: store.complete_snapshots(tick, 1), "a complete snapshot")
            expected = expected_from_input_logs(cluster, wordcount.graph())
            got = consume_all(client, "snap", len(expected), timeout=120)
        assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
        assert len(expected) == 50 * 4 + 50 * 3 + pushed * 2
        assert "snapshot below" in (data / "logs" / f"{node['name']}.log").read_text()
        _info, state = read_snapshot(data / "snapshots" / boundary / "worker-0.snap")  # rebuilt from the whole state
        assert flatten(state) == oracle_state(wordcount.graph(), read_input_logs(data), boundary_of(boundary))


def slow_split(line: str) -> list[str]:
    """A slow map, so admitted events stay in flight long enough to use up the front's credit."""
    time.sleep(1.0)
    return line.split()


def slow_wordcount() -> Any:
    """Word count (``test_limits.wordcount``) with a slow split; all functions in this package, which the
    graph's own package makes allowed everywhere."""
    return wordcount_graph(fn=slow_split)


@contextlib.contextmanager
def _nodes(zookeeper: str, cluster: str, *node_args: list[str]) -> Iterator[None]:
    """``flamestream node`` processes with these flags (each one's role flags), ready, for the block; then
    terminated.  For tests that need node flags ``up`` does not pass on."""
    root = Path(__file__).resolve().parents[1]
    common = ["python", "-m", "flamestream", "node", "--zookeeper", zookeeper, "--cluster", cluster]
    procs = [subprocess.Popen(common + args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for args in node_args]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
            assert proc.stdout is not None
            proc.stdout.close()


def test_credit_backpressure_refuses_then_the_sdk_retries(tmp_path: Path, zookeeper: str, cluster_name: str) -> None:
    data = tmp_path / "node"
    # The worker on a node of its own: a slow map blocks its node's event loop, and the front must stay responsive.
    with _nodes(zookeeper, cluster_name, ["--acker", "--front", "0", "--barrier", "0", "--data-dir", str(data),
                                          "--max-in-flight-events", "5"], ["--worker", "0"]):
        graph = slow_wordcount()
        with Client(zookeeper, cluster_name, retries=0) as impatient, Client(zookeeper, cluster_name) as client:
            client.deploy(graph)
            client.push([f"a b {i}" for i in range(5)], producer="bp")  # 5 events: 5 s of work, credit used up
            with pytest.raises(ClientError) as refused:
                impatient.push(["c d"], producer="other")
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-in-flight-events" in str(refused.value) and "retry" in str(refused.value)
            client.push([f"e f {i}" for i in range(12)], producer="bp")  # waits and retries: all admitted
            expected = expected_from_input_logs(Cluster(data, zookeeper, cluster_name), graph)
            got = consume_all(client, "bp", len(expected), timeout=60)
        assert as_multiset([(r.time, r.payload) for r in got]) == as_multiset(expected)
        assert len(expected) == 3 * 17


def test_a_worker_over_its_memory_budget_pauses_admission_naming_it(tmp_path: Path, zookeeper: str,
                                                                     cluster_name: str) -> None:
    """``--memory-budget-mb 1`` is below any process's size, so the worker is over it from its first look: the
    front admits nothing (a push waits, then gets RESOURCE_EXHAUSTED naming the worker, its size and its budget,
    as transient), and stays SERVING.  (The way back under, 90% of the budget, is
    ``test_limits.py``'s; a process rarely gives memory back to the system on its own.)"""
    data = tmp_path / "node"
    with _nodes(zookeeper, cluster_name, ["--acker", "--front", "0", "--barrier", "0", "--data-dir", str(data)],
                ["--worker", "0", "--memory-budget-mb", "1"]), \
            Client(zookeeper, cluster_name, retries=0) as impatient, ClusterStore(zookeeper, cluster=cluster_name) \
            as store:
        impatient.deploy(wordcount.graph())
        reason = eventually(lambda: store.pressure().get("worker0"), "worker0 to report its memory pressure")
        assert "worker0 is over its memory budget" in reason and "--memory-budget-mb 1)" in reason
        with pytest.raises(ClientError) as refused:
            impatient.push(["a b"], producer="p")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason in str(refused.value) and RETRY_HINT in str(refused.value)
        assert read_input_logs(data) == []  # nothing admitted
        front = next(m for m in store.members("front").values())
        assert health(str(front["address"]), "front0") == "SERVING"


@pytest.mark.parametrize("cap", [None, 8])
def test_a_worker_whose_snapshots_cost_too_much_cpu_takes_them_at_fewer_boundaries(
        tmp_path: Path, zookeeper: str, cluster_name: str, cap: int | None) -> None:
    """``--snapshot-cpu-share`` so small that any snapshot costs more: after its first snapshot the worker takes
    them only below every ``--snapshot-max-stride``-th boundary (``MAX_SNAPSHOT_STRIDE`` unless given), so the
    complete snapshots are that far apart (at every boundary, 20 ms, the two newest would be 20 ms apart), and
    each still holds exactly the oracle's state below it."""
    data = tmp_path / "node"
    interval = 20
    stride = cap or MAX_SNAPSHOT_STRIDE
    given = ["--snapshot-max-stride", str(cap)] if cap else []
    with _nodes(zookeeper, cluster_name, ["--acker", "--front", "0", "--barrier", "0", "--worker", "0",
                                          "--data-dir", str(data), "--snapshot-interval-ms", str(interval),
                                          "--snapshot-cpu-share", "1e-9", *given]), \
            Client(zookeeper, cluster_name) as client, ClusterStore(zookeeper, cluster=cluster_name) as store:
        client.deploy(wordcount.graph())
        tick = store.ticks()[-1][0]
        pushed = 0
        seen: set[str] = set()

        def two_strided() -> list[str]:
            nonlocal pushed
            client.push([f"w{pushed % 7} x {pushed}"], producer="stride")  # the min time moves with input
            pushed += 1
            complete = store.complete_snapshots(tick, 1)
            seen.update(complete)
            return complete if len(complete) == 2 and all(boundary_of(b).ts // interval % stride == 0
                                                           for b in complete) else []

        older, newer = eventually(two_strided, "two complete snapshots on the stride")
        assert boundary_of(newer).ts - boundary_of(older).ts >= interval * stride
        off = sorted(b for b in seen if boundary_of(b).ts // interval % stride)
        assert len(off) <= 1, f"snapshots off the stride after the first: {off}"  # the first, before its cost
        for boundary in (older, newer):
            _info, state = read_snapshot(data / "snapshots" / boundary / "worker-0.snap")
            assert flatten(state) == oracle_state(wordcount.graph(), read_input_logs(data), boundary_of(boundary))
