"""Retention and fallback: input-log segments below the oldest retained complete snapshot go, and a hand-over whose
snapshot is damaged falls back to an older one plus the logged events in between — never to a wrong state.

The unit tests run without processes; the ``slow`` ones run real clusters: one with small input-log segments and
a short snapshot interval, whose old segments and snapshots must be gone while a Spark replay from the oldest
retained snapshot still equals the topic; one whose hand-over snapshot is corrupted on disk right after it is
written, which must fall back and still give the oracle's output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from flamestream import Graph, run_oracle
from flamestream.client import Client
from flamestream.cluster import ClusterStore, SnapshotsSeen
from flamestream.core.front import Stamped, stamp_inputs
from flamestream.core.local import Handover, LocalRuntime
from flamestream.core.meta import GlobalTime, boundary_name, boundary_of
from flamestream.core.oracle import oracle_state
from flamestream.core.tick import Layout
from flamestream.core.worker import WorkerState, merge_states
from flamestream.fronts.service import _open_input_log
from flamestream.runtime.channels import LocalEndpoints
from flamestream.storage.input_log import (
    Truncation,
    check_covers,
    checkpoint_path,
    encode_record,
    front_log_dir,
    plan_truncation,
    read_checkpoint,
    read_input_logs,
    read_input_range,
    truncation,
    write_checkpoint,
)
from flamestream.storage.log import LogError, SegmentedLog
from flamestream.storage.snapshots import MAX_CHAIN, read_snapshot, snapshot_path, write_snapshot
from flamestream.workers.service import WorkerService, _catch_up
from tests.test_handover import flatten
from tests.test_handover_cluster import Pusher, lines

ROOT = Path(__file__).resolve().parents[1]
LINES = [f"the dog {i % 5} and the cat {i % 3}" for i in range(120)]


def write_logs(data_dir: Path, stamped: list[Stamped], segment_bytes: int = 300,
               producer: str = "") -> dict[int, SegmentedLog]:
    """Input logs as fronts write them (one per front, small segments); left open as the fronts' writers."""
    logs: dict[int, SegmentedLog] = {}
    for i, (front, gt, trace, payload) in enumerate(stamped):
        if front not in logs:
            logs[front] = SegmentedLog(front_log_dir(data_dir, front), segment_bytes=segment_bytes, fsync=False)
        logs[front].append(encode_record(gt, trace[0], payload, producer, i if producer else 0))
    return logs


def times(directory: Path) -> list[GlobalTime]:
    with SegmentedLog(directory, readonly=True) as log:
        return [GlobalTime(r["ts"], r["front"]) for r in (json.loads(d) for _, d in log.scan(log.start_offset))]


# -- which segments go ---------------------------------------------------------------------------------------


def test_only_segments_wholly_below_the_boundary_go_and_an_event_at_it_stays(tmp_path: Path) -> None:
    stamped = stamp_inputs(LINES, 1, per_ms=1)  # one event per millisecond: times 0, 1, 2, ...
    (log,) = write_logs(tmp_path, stamped).values()
    directory = front_log_dir(tmp_path, 0)
    bases = log.segment_bases
    assert len(bases) > 6
    at = GlobalTime(bases[3], 0)  # exactly the first event of the fourth segment
    planned = plan_truncation(directory, at)
    assert planned is not None
    offset, state = planned
    assert offset == bases[3]  # segments 0..2 hold only times below it; the fourth starts *at* it and stays
    assert state.last == GlobalTime(bases[3] - 1, 0) and state.last_ts == bases[3] - 1
    earlier = plan_truncation(directory, GlobalTime(bases[3] - 1, 0))  # one ms earlier: the third segment stays
    assert earlier is not None and earlier[0] == bases[2] and earlier[1].last == GlobalTime(bases[2] - 1, 0)
    assert log.truncate_before(offset, state.meta()) == bases[3]
    assert times(directory)[0] == at and truncation(directory).last == state.last
    assert plan_truncation(directory, at) is None  # nothing more below it
    everything = plan_truncation(directory, GlobalTime(10**12, 0))
    assert everything is not None and everything[0] == bases[-1]  # the active segment never goes
    log.close()


def test_the_boundarys_front_breaks_ties_in_global_time(tmp_path: Path) -> None:
    """Global time is (ts, front): at boundary (ts, 0), front 1's event of the same ts is not below it."""
    stamped = stamp_inputs(LINES, 2, per_ms=1)  # fronts 0 and 1 share each millisecond
    logs = write_logs(tmp_path, stamped, segment_bytes=200)
    front1 = front_log_dir(tmp_path, 1)
    bases = logs[1].segment_bases
    first_of_third = times(front1)[bases[2]]
    planned = plan_truncation(front1, GlobalTime(first_of_third.ts, 0))  # (ts, 0) < (ts, 1): segment 2 stays
    assert planned is not None and planned[0] == bases[2]
    planned = plan_truncation(front1, GlobalTime(first_of_third.ts, 2))
    assert planned is not None and planned[0] == bases[2]  # (ts, 1) < (ts, 2) but more of segment 2 is not
    for log in logs.values():
        log.close()


def test_a_restarted_front_still_knows_its_producers_and_its_last_time(tmp_path: Path) -> None:
    """Dedup survives retention: the marker remembers each producer's last sequence and the last timestamp."""
    stamped = stamp_inputs(LINES, 1, per_ms=1)
    (log,) = write_logs(tmp_path, stamped, producer="p").values()
    directory = front_log_dir(tmp_path, 0)
    planned = plan_truncation(directory, GlobalTime(10**12, 0))  # every sealed segment goes
    assert planned is not None
    log.truncate_before(planned[0], planned[1].meta())
    log.close()
    assert truncation(directory).producers["p"] == (planned[0] - 1, GlobalTime(planned[0] - 1, 0))
    reopened, producers, last_ts = _open_input_log(directory, 300)
    reopened.close()
    assert producers.last("p") == len(LINES) - 1 and last_ts == len(LINES) - 1


def test_a_producer_seen_only_in_deleted_records_is_still_deduplicated(tmp_path: Path) -> None:
    directory = front_log_dir(tmp_path, 0)
    with SegmentedLog(directory, segment_bytes=120, fsync=False) as log:
        for i in range(10):
            log.append(encode_record(GlobalTime(i, 0), 0, f"old {i}", "gone", i))
        for i in range(10, 20):
            log.append(encode_record(GlobalTime(i, 0), 0, f"new {i}", "kept", i))
        planned = plan_truncation(directory, GlobalTime(10, 0))
        assert planned is not None and planned[1].producers["gone"] == (9, GlobalTime(9, 0))
        log.truncate_before(planned[0], planned[1].meta())
        assert all(json.loads(d)["producer"] == "kept" for _, d in log.scan(log.start_offset))
    reopened, producers, last_ts = _open_input_log(directory, 120)
    reopened.close()
    assert producers.last("gone") == 9 and producers.time_of("gone", 9) == GlobalTime(9, 0)
    assert producers.last("kept") == 19 and last_ts == 19


def test_a_restart_reads_the_log_only_after_its_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The checkpoint stands for every record below its offset: a record there that is no front record is not
    even read (a full read refuses it), and the table equals the full read's.  A checkpoint outside the log is
    ignored, with a warning, and the whole log is read."""
    directory = front_log_dir(tmp_path, 0)
    with SegmentedLog(directory, fsync=False) as log:
        log.append(b'{"not": "a front record"}')
        for i in range(1, 20):
            log.append(encode_record(GlobalTime(100 + i, 0), 0, f"event {i}", "p" if i % 2 else "q", i))
    with pytest.raises(LogError, match="record 0 is not a front record"):
        _open_input_log(directory)
    write_checkpoint(directory, Truncation(start=1, last_ts=100, producers={"q": (0, GlobalTime(100, 0))}))
    reopened, producers, last_ts = _open_input_log(directory)
    reopened.close()
    assert producers.lasts() == {"p": (19, GlobalTime(119, 0)), "q": (18, GlobalTime(118, 0))} and last_ts == 119
    write_checkpoint(directory, Truncation(start=20, last_ts=119, producers=producers.lasts()))
    reopened, from_end, last_ts = _open_input_log(directory)
    reopened.close()
    assert from_end.lasts() == producers.lasts() and last_ts == 119
    assert read_checkpoint(directory) == Truncation(start=20, last_ts=119, producers=producers.lasts())
    write_checkpoint(directory, Truncation(start=21, last_ts=119))
    with caplog.at_level(logging.WARNING), pytest.raises(LogError, match="record 0 is not a front record"):
        _open_input_log(directory)
    assert "ignoring a checkpoint at offset 21 outside the log (0..20)" in caplog.text
    checkpoint_path(directory).write_text("{")
    with pytest.raises(LogError, match="is not a front's checkpoint"):
        read_checkpoint(directory)


# -- who may still read a truncated log ------------------------------------------------------------------------


def test_a_truncated_log_is_refused_unless_read_from_after_what_went(tmp_path: Path) -> None:
    stamped = stamp_inputs(LINES, 1, per_ms=1)
    (log,) = write_logs(tmp_path, stamped).values()
    directory = front_log_dir(tmp_path, 0)
    check_covers(directory, None)  # whole: fine from the beginning
    planned = plan_truncation(directory, GlobalTime(50, 0))
    assert planned is not None
    log.truncate_before(planned[0], planned[1].meta())
    log.close()
    last = planned[1].last
    assert last is not None and last < GlobalTime(50, 0)
    with pytest.raises(LogError, match=r"retention deleted this input log's events up to \d+:0 .* cannot be replayed "
                                       r"from the beginning"):
        check_covers(directory, None)
    with pytest.raises(LogError, match=f"cannot be replayed from {last.ts}:0"):
        check_covers(directory, last)
    check_covers(directory, GlobalTime(last.ts, 1))  # just after what went
    check_covers(directory, GlobalTime(50, 0))
    with pytest.raises(LogError, match="below the start of the log"):
        read_input_logs(tmp_path)  # the whole history is gone: an error, never a shorter list
    assert [s[1] for s in read_input_range(tmp_path, GlobalTime(50, 0), GlobalTime(60, 0))] == \
        [GlobalTime(t, 0) for t in range(50, 60)]
    with pytest.raises(LogError, match="retention deleted"):
        read_input_range(tmp_path, GlobalTime(1, 0), GlobalTime(60, 0))


def test_read_input_range_merges_fronts_in_meta_order(tmp_path: Path) -> None:
    stamped = stamp_inputs(LINES, 2, per_ms=2)
    for log in write_logs(tmp_path, stamped, segment_bytes=150).values():
        log.close()
    start, stop = stamped[31][1], stamped[77][1]
    expected = sorted((s for s in stamped if start <= s[1] < stop), key=lambda s: (s[1], s[2]))
    assert read_input_range(tmp_path, start, stop) == expected


# -- the fallback hand-over -------------------------------------------------------------------------------------


def state_at(graph: Graph, stamped: list[Stamped], at: GlobalTime) -> WorkerState:
    """The whole state below ``at``, as a cluster's hand-over would carry it (distributed run, replays and all)."""
    result = LocalRuntime(graph, workers=3, fronts=2, per_ms=2, seed=5, batch=4,
                          handovers=[Handover(at, workers=2)]).run_stamped(stamped)
    ((boundary, state),) = result.handed_over
    assert boundary == at
    return state


def comparable(state: WorkerState) -> dict[str, list[Any]]:
    """A state as (hash, key, [(global time, payload)]) per grouping, sorted: traces carry each run's own
    logical clocks, the order and the contents are what must agree."""
    return {name: sorted(((h, repr(key), [(gt, json.dumps(p, sort_keys=True)) for (gt, _trace), p in entries])
                          for h, key, entries in buckets), key=repr) for name, buckets in state.items()}


def test_catch_up_from_an_older_snapshot_rebuilds_the_state_below_the_boundary(tmp_path: Path) -> None:
    graph = wordcount.graph()
    stamped = stamp_inputs(LINES, 2, per_ms=2)
    older, at = stamped[40][1], stamped[90][1]
    for log in write_logs(tmp_path, stamped).values():
        log.close()
    rebuilt, events = _catch_up(graph.to_dict(), state_at(graph, stamped, older), older, at, tmp_path)
    assert events == sum(1 for s in stamped if older <= s[1] < at)
    assert comparable(rebuilt) == comparable(state_at(graph, stamped, at))


class FakeStore:
    """The two ZooKeeper reads a hand-over makes: the previous tick's snapshots (boundary -> worker -> info)."""

    def __init__(self) -> None:
        self.registered: dict[str, dict[str, dict[str, Any]]] = {}

    def snapshots(self, tick: int) -> dict[str, dict[str, dict[str, Any]]]:
        return self.registered


def write_complete(data_dir: Path, store: FakeStore, state: WorkerState, at: GlobalTime) -> list[Path]:
    layout = Layout.even(2)
    paths = []
    for i in range(2):
        share = {name: [b for b in buckets if layout.owner(b[0]) == i] for name, buckets in state.items()}
        path = snapshot_path(data_dir, at, i)
        write_snapshot(path, share, boundary=at, worker=i, tick=0)
        store.registered.setdefault(boundary_name(at), {})[f"worker{i}"] = {"path": str(path)}
        paths.append(path)
    return paths


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_damaged_hand_over_snapshot_falls_back_to_an_older_one_or_refuses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from flamestream.core.tick import Tick

    graph = wordcount.graph()
    stamped = stamp_inputs(LINES, 2, per_ms=2)
    oldest, older, at = stamped[20][1], stamped[40][1], stamped[90][1]
    for log in write_logs(tmp_path, stamped).values():
        log.close()
    store = FakeStore()
    write_complete(tmp_path, store, state_at(graph, stamped, oldest), oldest)
    older_files = write_complete(tmp_path, store, state_at(graph, stamped, older), older)
    newest_files = write_complete(tmp_path, store, state_at(graph, stamped, at), at)
    service = WorkerService(0, LocalEndpoints(), store, tmp_path)  # type: ignore[arg-type]
    tick = Tick(number=1, start=at, graph=graph.to_dict(), layout=Layout.even(2), previous=0)
    previous = {"graph": graph.to_dict(), "workers": ["a", "b"], "layout": list(Layout.even(2).starts)}
    complete = [boundary_name(oldest), boundary_name(older), boundary_name(at)]
    whole = state_at(graph, stamped, at)
    expected = comparable(whole)
    own = comparable({name: [b for b in buckets if Layout.even(2).owner(b[0]) == 0] for name, buckets in whole.items()})
    assert own != expected

    state, frozen, files, how = service._handed_over(tick, 0, previous, complete)
    # intact: its own file of the snapshot below T, its buckets as read (for the core to decode when needed)
    assert (state, files, how) == ({}, 1, "")
    assert comparable({name: [(b.h, b.key, b.entries()) for b in buckets] for name, buckets in frozen.items()}) == own

    flip(newest_files[1])  # another worker's file: not read by this one
    assert service._handed_over(tick, 0, previous, complete)[2:] == (1, "")

    flip(newest_files[0])
    with caplog.at_level(logging.WARNING):
        state, frozen, files, how = service._handed_over(tick, 0, previous, complete)
    # rebuilt from an older snapshot: all of it, as re-processing the events crosses ranges
    assert comparable(state) == expected and f"older snapshot below {boundary_name(older)}" in how and files == 2
    assert frozen == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(newest_files[0]) in w and "is corrupted: its checksum does not match" in w for w in warnings)
    assert any("from its older snapshot below" in w for w in warnings)

    older_files[0].write_bytes(older_files[0].read_bytes()[:100])  # torn: the next older one is used then
    state, _frozen, _files, how = service._handed_over(tick, 0, previous, complete)
    assert comparable(state) == expected and f"below {boundary_name(oldest)}" in how

    flip(Path(store.registered[boundary_name(oldest)]["worker0"]["path"]))  # none left: refused, loudly
    with pytest.raises(RuntimeError, match=r"cannot take over the state of tick 0 below .*: no retained complete "
                                           r"snapshot is intact and usable .*processes nothing rather than start "
                                           r"from a wrong state"):
        service._handed_over(tick, 0, previous, complete)


def test_a_worker_that_takes_a_snapshot_over_starts_its_image_from_the_chunks_it_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_take_over``: the core holds the worker's share of the snapshot, none of it decoded yet nor reported as
    changed, and its snapshot image is that file's buckets as read, encoded by nobody: written at the same
    boundary it is the same file, and a change after the take-over encodes just its bucket."""
    from flamestream.core import values
    from flamestream.core.plan import compile_graph
    from flamestream.core.tick import Tick
    from flamestream.core.worker import Worker
    from flamestream.workers.service import _Deployment

    graph = wordcount.graph()
    stamped = stamp_inputs(LINES, 2, per_ms=2)
    at = stamped[90][1]
    store = FakeStore()
    own_file = write_complete(tmp_path, store, state_at(graph, stamped, at), at)[0]
    service = WorkerService(0, LocalEndpoints(), store, tmp_path)  # type: ignore[arg-type]
    tick = Tick(number=1, start=at, graph=graph.to_dict(), layout=Layout.even(2), previous=0)
    previous = {"graph": graph.to_dict(), "workers": ["a", "b"], "layout": list(Layout.even(2).starts)}
    deployment = _Deployment(tick, Worker(compile_graph(graph), 0, tick.layout), LocalEndpoints(), lambda _: None)
    assert deployment.image is not None
    encoded: list[Any] = []
    encode_each = values.encode_each

    def counted(each: Any) -> Any:
        for value in each:
            encoded.append(value)
            yield from encode_each([value])

    monkeypatch.setattr(values, "encode_each", counted)
    assert service._take_over(deployment, 0, previous, [boundary_name(at)]) == (1, "")
    assert encoded == []
    assert deployment.core.state_size() == 0  # taken over lazily: no bucket decoded yet

    _info, own = read_snapshot(own_file)
    assert own and comparable(deployment.core.snapshot(at)) == comparable(own)
    assert all(not buckets for buckets in deployment.core.snapshot_changes(at).values())
    again = snapshot_path(tmp_path / "again", at, 0)
    deployment.image.write(again, boundary=at, worker=0, tick=0)
    assert again.read_bytes() == own_file.read_bytes()

    name, buckets = next((n, b) for n, b in own.items() if b)
    h, key, entries = buckets[0]
    encoded.clear()  # the write encoded each grouping's index
    deployment.image.update({name: [(h, key, entries)]})  # a change: only its bucket is encoded
    assert len(encoded) == 1 and len(encoded[0]) == len(entries)


def test_a_fallback_without_the_events_in_between_is_refused(tmp_path: Path) -> None:
    """Retention keeps the log from the oldest retained snapshot on; if the events after an older snapshot are
    gone anyway, that snapshot is no way back either."""
    from flamestream.core.tick import Tick

    graph = wordcount.graph()
    stamped = stamp_inputs(LINES, 2, per_ms=2)
    older, at = stamped[40][1], stamped[90][1]
    logs = write_logs(tmp_path, stamped)
    for front, log in logs.items():
        planned = plan_truncation(front_log_dir(tmp_path, front), stamped[60][1])
        assert planned is not None
        log.truncate_before(planned[0], planned[1].meta())
        log.close()
    store = FakeStore()
    write_complete(tmp_path, store, state_at(graph, stamped, older), older)
    flip(write_complete(tmp_path, store, state_at(graph, stamped, at), at)[0])
    service = WorkerService(0, LocalEndpoints(), store, tmp_path)  # type: ignore[arg-type]
    tick = Tick(number=1, start=at, graph=graph.to_dict(), layout=Layout.even(2), previous=0)
    with pytest.raises(RuntimeError, match=rf"{boundary_name(older)}: .*retention deleted this input log's events"):
        service._handed_over(tick, 0, {"graph": graph.to_dict(), "workers": ["a", "b"],
                                       "layout": list(Layout.even(2).starts)},
                             [boundary_name(older), boundary_name(at)])


# -- ZooKeeper: which snapshots are complete ------------------------------------------------------------------


def test_complete_snapshots_and_the_oldest_one_of_any_tick(zookeeper: str, cluster_name: str) -> None:
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        store.publish_tick({"workers": ["a", "b"]})
        store.publish_tick({"workers": ["a", "b", "c"]})
        assert store.complete_snapshots(0, 2) == [] and store.oldest_complete_snapshot() is None
        for boundary, workers in (("2000-0", (0, 1)), ("1000-0", (0, 1)), ("999-1", (1,)), ("10000-0", (0, 1)),
                                  ("3000-0", (0,))):
            for i in workers:
                store.register_snapshot(0, boundary, i, {"path": f"/x/{boundary}/{i}"})
        assert store.complete_snapshots(0, 2) == ["1000-0", "2000-0", "10000-0"]  # by time, not as strings
        # retention's read: who registered each boundary, the names only (what complete_boundaries counts)
        assert store.registered_snapshots(0) == {b: dict.fromkeys(r) for b, r in store.snapshots(0).items()}
        assert store.registered_snapshots(0)["999-1"] == {"worker1": None} and store.registered_snapshots(7) == {}
        assert store.complete_snapshots(0, 3) == []
        for i in (0, 1, 2):
            store.register_snapshot(1, "20000-0", i, {})
        store.register_snapshot(1, "500-0", 0, {})  # incomplete: does not count
        assert store.complete_snapshots(1, 3) == ["20000-0"]
        assert store.oldest_complete_snapshot() == "1000-0"
        store.forget_snapshot(0, "1000-0")
        store.forget_snapshot(0, "2000-0")
        assert store.oldest_complete_snapshot() == "10000-0"
        store.forget_snapshot(0, "10000-0")
        assert store.oldest_complete_snapshot() == "20000-0"


def test_the_oldest_complete_snapshot_skips_the_ticks_retention_swept(zookeeper: str, cluster_name: str) -> None:
    """A look starts past the unbroken run of ticks without registrations below a tick with a complete
    snapshot: those are swept for good, and asking about each every second grew with the cluster's history."""
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        for _ in range(6):
            store.publish_tick({"workers": ["a"]})
        store.register_snapshot(1, "500-0", 0, {})
        store.register_snapshot(3, "1000-0", 0, {})
        store.register_snapshot(4, "2000-0", 0, {})
        seen = SnapshotsSeen()
        assert store.oldest_complete_snapshot(seen) == "500-0" and seen.since == 1  # tick 0 holds nothing, 1 does
        store.forget_snapshot(1, "500-0")
        assert store.oldest_complete_snapshot(seen) == "1000-0" and seen.since == 3
        store.forget_snapshot(3, "1000-0")
        assert store.oldest_complete_snapshot(seen) == "2000-0" and seen.since == 4
        store.register_snapshot(2, "100-0", 0, {})  # a registration no worker makes (ticks below 4 were swept)
        assert store.oldest_complete_snapshot(seen) == "2000-0"  # ... is not looked for again
        assert store.oldest_complete_snapshot() == "100-0"  # a restarted front looks at every tick once
        store.forget_snapshot(4, "2000-0")
        assert store.oldest_complete_snapshot(seen) is None and seen.since == 4  # no complete snapshot: none swept


def test_a_look_reads_only_the_registrations_it_has_not_seen_complete(zookeeper: str, cluster_name: str) -> None:
    """Complete snapshots stay complete until forgotten, so a front's look reads a tick's worker count and a
    boundary's registrations once; an incomplete one is read again until it completes."""
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        store.publish_tick({"workers": ["a", "b"]})
        store.register_snapshot(0, "1000-0", 0, {})
        store.register_snapshot(0, "1000-0", 1, {})
        store.register_snapshot(0, "500-0", 0, {})
        seen = SnapshotsSeen()
        assert store.oldest_complete_snapshot(seen) == "1000-0"
        both = dict.fromkeys(["worker0", "worker1"])  # the names that registered a complete snapshot
        assert seen.complete == {0: {"1000-0": both}} and seen.workers == {0: 2}
        store.register_snapshot(0, "500-0", 1, {})
        assert store.oldest_complete_snapshot(seen) == "500-0"
        assert seen.complete == {0: {"1000-0": both, "500-0": both}}
        store.forget_snapshot(0, "500-0")
        assert store.oldest_complete_snapshot(seen) == "1000-0" and seen.complete == {0: {"1000-0": both}}
        zk = store._zk  # spies on the real client's two reads, to count what the next look asks
        children, data = zk.get_children, zk.get
        calls: list[str] = []

        def counted(read: Any) -> Any:
            def call(path: str, *args: Any, **kwargs: Any) -> Any:
                calls.append(path)
                return read(path, *args, **kwargs)
            return call

        zk.get_children, zk.get = counted(children), counted(data)
        try:
            assert store.oldest_complete_snapshot(seen) == "1000-0"
        finally:
            zk.get_children, zk.get = children, data
        assert calls == [f"{store.base}/ticks", f"{store.base}/ticks/{0:010d}/snapshots"]


def test_registering_and_forgetting_a_snapshot_take_a_request_or_two(zookeeper: str, cluster_name: str) -> None:
    """What every worker asks ZooKeeper after each periodic snapshot: the first registration of a boundary creates
    its node in the same request, and retention's read skips the boundaries it saw complete and forgets one in a
    single request; whoever comes second, or with stale names, still ends with the same nodes."""
    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        store.publish_tick({"workers": ["a", "b"]})
        store.register_snapshot(0, "500-0", 0, {"v": 1})  # the tick's first: its snapshots node is made too
        zk = store._zk  # counts every request the real client sends (kazoo sends each through _call)
        send, calls = zk._call, []

        def counted(request: Any, result: Any) -> Any:
            calls.append(type(request).__name__)
            return send(request, result)

        def requests(call: Callable[[], Any]) -> list[str]:
            calls.clear()
            zk._call = counted
            try:
                call()
            finally:
                zk._call = send
            return list(calls)

        assert requests(lambda: store.register_snapshot(0, "1000-0", 0, {"v": 1})) == ["Transaction"]
        assert requests(lambda: store.register_snapshot(0, "1000-0", 1, {"v": 1})) == ["Transaction", "Create"]
        store.register_snapshot(0, "1000-0", 1, {"v": 2})  # a restarted worker registers again
        assert store.snapshots(0)["1000-0"] == {"worker0": {"v": 1}, "worker1": {"v": 2}}
        store.register_snapshot(0, "500-0", 1, {})
        store.register_snapshot(0, "2000-0", 0, {})
        full = store.registered_snapshots(0)
        seen = {b: full[b] for b in ("500-0", "1000-0")}
        assert requests(lambda: store.registered_snapshots(0, seen)) == ["GetChildren", "GetChildren"]
        assert store.registered_snapshots(0, seen) == full
        assert requests(lambda: store.forget_snapshot(0, "500-0", full["500-0"])) == ["Transaction"]
        store.forget_snapshot(0, "500-0", full["500-0"])  # another worker was first: nothing left, no error
        store.register_snapshot(0, "2000-0", 1, {})
        store.forget_snapshot(0, "2000-0", ["worker0"])  # a registration came after the read: it goes too
        assert store.registered_snapshots(0) == {"1000-0": {"worker0": None, "worker1": None}}


# -- real clusters ---------------------------------------------------------------------------------------------


class Mirror(threading.Thread):
    """Hard-links every input-log file into a copy as soon as it appears, so the test keeps the whole input for
    the oracle while retention deletes it from the cluster's own directory (a link shares the inode: appends to
    the active segment show in the copy, and deleting the original leaves the copy)."""

    def __init__(self, source: Path, target: Path) -> None:
        super().__init__(daemon=True)
        self.source, self.target = source, target
        self.stop = threading.Event()

    def sweep(self) -> None:
        for front in (path for path in self.source.glob("front-*") if path.is_dir()):
            (self.target / front.name).mkdir(parents=True, exist_ok=True)
            for path in front.iterdir():
                copy = self.target / front.name / path.name
                if path.suffix in (".log", ".index") and not copy.exists():
                    with contextlib.suppress(FileNotFoundError):  # deleted in between: a segment seen earlier
                        os.link(path, copy)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sweep()
            time.sleep(0.02)


def cli(*args: str) -> Any:
    from tests.test_cluster_e2e import cli as run_cli

    return run_cli(*args)


def consume_everything(zookeeper: str, cluster: str, count: int) -> list[tuple[GlobalTime, Any]]:
    got: list[tuple[GlobalTime, Any]] = []
    with Client(zookeeper, cluster) as client:
        for record in client.consume(group="check", timeout=30):
            got.append((GlobalTime(*record.time), record.payload))
            if len(got) >= count:
                break
    return got


def as_multiset(pairs: list[tuple[GlobalTime, Any]]) -> Counter[tuple[GlobalTime, str]]:
    return Counter((gt, json.dumps(p, sort_keys=True, ensure_ascii=False)) for gt, p in pairs)


def snapshot_dirs(data: Path) -> list[Path]:
    return sorted((p for p in (data / "snapshots").iterdir() if p.is_dir()),
                  key=lambda p: tuple(map(int, p.name.split("-"))))


@pytest.fixture
def cluster_up(tmp_path: Path, zookeeper: str, cluster_name: str) -> Iterator[tuple[Path, str, str]]:
    data = tmp_path / "cluster"
    yield data, zookeeper, cluster_name
    done = cli("down", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_retention_on_a_cluster_and_a_replay_from_the_oldest_retained_snapshot(
        cluster_up: tuple[Path, str, str], tmp_path: Path, spark: Any) -> None:
    from flamestream.spark.replay import ReplayError, replay
    from tests.test_replay import replayed

    data, zookeeper, cluster = cluster_up
    up = cli("up", "--nodes", "2", "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster,
             "--snapshot-interval-ms", "300", "--log-segment-bytes", "4096")
    assert up.returncode == 0, up.stdout + up.stderr
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster).returncode == 0
    (data / "input").mkdir(parents=True, exist_ok=True)
    mirror = Mirror(data / "input", tmp_path / "mirror" / "input")
    mirror.start()
    pusher = Pusher(zookeeper, cluster, lines(), 0.01)
    pusher.start()
    log_dir = front_log_dir(data, 0)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (truncation(log_dir).start == 0 or pusher.pushed < 1500):
        time.sleep(0.2)
    pusher.stop.set()
    pusher.join(30)
    assert pusher.error is None, repr(pusher.error)
    time.sleep(2)  # the last snapshots and the last retention round
    mirror.stop.set()
    mirror.join()
    mirror.sweep()

    gone = truncation(log_dir)
    assert gone.start > 0 and gone.last is not None, "retention never deleted a segment"
    segments = sorted(int(p.stem) for p in log_dir.glob("*.log"))
    mirrored = sorted(int(p.stem) for p in (tmp_path / "mirror" / "input" / "front-0").glob("*.log"))
    assert segments[0] == gone.start and len(mirrored) > len(segments)  # old segments are gone ...
    expected = run_oracle(wordcount.graph(), read_input_logs(tmp_path / "mirror"))[0]
    got = consume_everything(zookeeper, cluster, len(expected))
    assert as_multiset(got) == as_multiset(expected)  # retention changed nothing in the output

    assert cli("down", "--data-dir", str(data)).returncode == 0  # nothing moves any more
    dirs = snapshot_dirs(data)
    # ... and old snapshots: K=2, ones being written, and the files the kept ones build on (deltas), each loadable
    assert 2 <= len(dirs) <= 4 + MAX_CHAIN, [p.name for p in dirs]
    for file in (data / "snapshots").rglob("*.snap"):
        read_snapshot(file)
    with ClusterStore(zookeeper, cluster) as store:
        oldest_name = store.oldest_complete_snapshot()
    assert oldest_name is not None
    at = boundary_of(oldest_name)
    last_gone = truncation(log_dir).last
    assert last_gone is not None and at > last_gone  # the log still covers the oldest retained snapshot
    oldest = data / "snapshots" / oldest_name
    # Periodic snapshots are written from the changes since the previous one: still the oracle's state below it.
    carried = merge_states(read_snapshot(oldest / f"worker-{i}.snap")[1] for i in range(2))
    assert flatten(carried) == oracle_state(wordcount.graph(), read_input_logs(tmp_path / "mirror"), at)
    graph = wordcount.graph()
    graph.sys_path = [str(ROOT)]
    out = tmp_path / "replayed"
    replay(spark, data, str(out), graph=graph, snapshot=oldest, partitions=2, progress=lambda line: None)
    after = [(gt, p) for gt, p in got if gt >= at]
    assert after and as_multiset(replayed(spark, out)) == as_multiset(after)
    with pytest.raises(ReplayError, match="retention deleted this input log's events"):
        replay(spark, data, str(tmp_path / "whole"), graph=graph, partitions=2, progress=lambda line: None)


@pytest.mark.slow
def test_a_corrupted_hand_over_snapshot_falls_back_and_the_output_is_still_the_oracles(
        cluster_up: tuple[Path, str, str]) -> None:
    data, zookeeper, cluster = cluster_up
    up = cli("up", "--nodes", "2", "--data-dir", str(data), "--zookeeper", zookeeper, "--cluster", cluster,
             "--snapshot-interval-ms", "300")
    assert up.returncode == 0, up.stdout + up.stderr
    assert cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster).returncode == 0
    pusher = Pusher(zookeeper, cluster, lines(), 0.02)
    pusher.start()
    fell_back = 0
    with ClusterStore(zookeeper, cluster=cluster) as store:
        for attempt in range(4):  # the corruption races the new workers' read: retried until it wins once
            number = store.latest_tick()[0]  # type: ignore[index]
            deadline = time.monotonic() + 30
            while len(store.complete_snapshots(number, 2)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            corrupted: list[Path] = []
            watcher = threading.Thread(target=corrupt_handover, args=(store, data, number + 1, corrupted),
                                       daemon=True)
            watcher.start()
            done = cli("deploy", "examples/wordcount.py", "--zookeeper", zookeeper, "--cluster", cluster)
            assert done.returncode == 0, done.stderr
            watcher.join(30)
            assert corrupted, f"attempt {attempt}: the hand-over snapshot never appeared"
            time.sleep(1)
            logs = "".join(p.read_text() for p in (data / "logs").glob("node*.log"))
            fell_back = logs.count("from its older snapshot below")
            if fell_back:
                assert f"{corrupted[0]} is corrupted: its checksum does not match" in logs
                break
    assert fell_back, "no attempt corrupted the snapshot before the new workers read it"
    pusher.stop.set()
    pusher.join(30)
    assert pusher.error is None, repr(pusher.error)
    expected = run_oracle(wordcount.graph(), read_input_logs(data))[0]
    got = consume_everything(zookeeper, cluster, len(expected))
    assert as_multiset(got) == as_multiset(expected)


def corrupt_handover(store: ClusterStore, data: Path, number: int, corrupted: list[Path]) -> None:
    """Wait for tick ``number``, then flip a byte of worker 0's hand-over snapshot file the moment it lands."""
    deadline = time.monotonic() + 30
    tick = None
    while tick is None and time.monotonic() < deadline:
        tick = store.tick(number)
        time.sleep(0.01)
    assert tick is not None
    path = snapshot_path(data, GlobalTime(*tick["start"]), 0)
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    with open(path, "r+b") as f:  # in place: the same file the new workers open
        f.seek(-7, os.SEEK_END)
        byte = f.read(1)
        f.seek(-7, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    corrupted.append(path)
