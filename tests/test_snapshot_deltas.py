"""Delta snapshots (format 5): a periodic snapshot written as the buckets that changed on top of the worker's
previous file reads back as the whole state, the chain stays short, a base that is gone or another file is named,
and retention keeps exactly the files a kept snapshot builds on (``storage/snapshots.py``, ``workers/service.py``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flamestream.cluster import ClusterStore
from flamestream.core.grouping import Entries
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.tick import Layout, Tick
from flamestream.core.worker import WorkerState
from flamestream.runtime.channels import LocalEndpoints
from flamestream.storage import snapshots
from flamestream.storage.snapshots import (
    CHAIN_SHARE,
    MAX_CHAIN,
    SnapshotError,
    SnapshotImage,
    SnapshotInfo,
    base_path,
    read_snapshot,
    read_snapshot_header,
    snapshot_dir,
    snapshot_path,
    write_snapshot,
)
from flamestream.workers import service as service_module
from flamestream.workers.service import WorkerService, _needed, _prune
from tests.test_snapshots import by_key

Model = dict[str, dict[Any, tuple[int, Entries]]]


def _entries(version: int, items: int) -> Entries:
    return [((GlobalTime(version, i), (0, i)), ("payload", version, "x" * (i * 7))) for i in range(items)]


def _applied(model: Model, changes: WorkerState) -> None:
    for name, buckets in changes.items():
        mine = model.setdefault(name, {})
        for h, key, entries in buckets:
            if entries:
                mine[key] = (h, entries)
            else:
                mine.pop(key, None)


# A step: per grouping, key -> its items (0 removes the key), each key once, as a worker's change report has it.
steps_st = st.lists(
    st.dictionaries(st.sampled_from(["a", "b"]),
                    st.dictionaries(st.integers(0, 11), st.integers(0, 3), max_size=8), max_size=2),
    min_size=1, max_size=14)


@settings(max_examples=60, deadline=None)
@given(steps=steps_st)
def test_every_file_written_reads_back_as_the_image_at_its_write(steps: list[dict[str, dict[int, int]]]) -> None:
    """Random changes (new keys, changed ones, keys that leave, groupings named without buckets) and a write after
    each: whole or delta, every file read afterwards is the state at its write — the older ones too, as long as the
    files they build on are there."""
    with tempfile.TemporaryDirectory() as directory:
        image = SnapshotImage()
        model: Model = {}
        written: list[tuple[Path, Model]] = []
        for version, step in enumerate(steps, 1):
            changes: WorkerState = {name: [(key * 31, key, _entries(version, items)) for key, items in pairs.items()]
                                    for name, pairs in step.items()}
            image.update(changes)
            _applied(model, changes)
            at = GlobalTime(1000 * version, 0)
            path = snapshot_path(Path(directory), at, 3)
            info = image.write(path, boundary=at, worker=3, tick=1)
            assert info.base is None or info.base < at
            assert info.keys == sum(map(len, model.values()))
            written.append((path, {name: dict(buckets) for name, buckets in model.items()}))
        for path, expected in written:
            assert by_key(read_snapshot(path)[1]) == expected


def _image_of(keys: int) -> SnapshotImage:
    image = SnapshotImage()
    image.update({"g": [(k, k, _entries(1, 2)) for k in range(keys)]})
    return image


def _write(image: SnapshotImage, directory: Path, n: int) -> tuple[Path, SnapshotInfo]:
    at = GlobalTime(n, 0)
    path = snapshot_path(directory, at, 0)
    return path, image.write(path, boundary=at, worker=0, tick=0)


def _start_of_chain(path: Path) -> GlobalTime:
    """The boundary of the whole file the snapshot at ``path`` builds on, through its headers' bases."""
    info = read_snapshot_header(path)
    while info.base is not None:
        path = base_path(path, info.base)
        info = read_snapshot_header(path)
    return info.boundary


def test_deltas_build_on_the_previous_file_until_the_chain_is_long_then_a_whole_file(tmp_path: Path) -> None:
    image = _image_of(100)
    _first, info = _write(image, tmp_path, 1)
    assert info.base is None and _start_of_chain(_first) == GlobalTime(1, 0)
    sizes = [info.body_bytes]
    for n in range(2, MAX_CHAIN + 2):
        image.update({"g": [(n, n, _entries(n, 1))]})
        path, info = _write(image, tmp_path, n)
        assert (info.base, _start_of_chain(path)) == (GlobalTime(n - 1, 0), GlobalTime(1, 0))
        assert read_snapshot_header(path) == info
        sizes.append(info.body_bytes)
    assert max(sizes[1:]) * 20 < sizes[0]  # a delta holds what changed, not the state
    expected = by_key(read_snapshot(path)[1])  # the end of the chain, read through all of it
    assert set(expected["g"]) == set(range(100)) and expected["g"][MAX_CHAIN + 1] == (MAX_CHAIN + 1,
                                                                                       _entries(MAX_CHAIN + 1, 1))
    image.update({"g": [(0, 0, _entries(99, 1))]})
    path, info = _write(image, tmp_path, MAX_CHAIN + 2)
    assert info.base is None and _start_of_chain(path) == GlobalTime(MAX_CHAIN + 2, 0)
    expected["g"][0] = (0, _entries(99, 1))
    assert by_key(read_snapshot(path)[1]) == expected


def test_a_file_is_whole_again_once_the_deltas_add_up_to_the_share_of_the_state(tmp_path: Path) -> None:
    """Each step changes every key, so each delta holds the whole state's bytes: ``CHAIN_SHARE`` of them fit."""
    image = _image_of(10)
    _write(image, tmp_path, 1)
    deltas = 0
    for n in range(2, MAX_CHAIN + 2):
        image.update({"g": [(k, k, _entries(n, 2)) for k in range(10)]})
        if _write(image, tmp_path, n)[1].base is None:
            break
        deltas += 1
    assert deltas == int(CHAIN_SHARE) < MAX_CHAIN


def test_a_write_to_the_same_file_or_an_earlier_boundary_is_whole(tmp_path: Path) -> None:
    image = _image_of(10)
    path, _info = _write(image, tmp_path, 5)
    image.update({"g": [(1, 1, _entries(2, 1))]})
    assert image.write(path, boundary=GlobalTime(5, 0), worker=0, tick=0).base is None
    image.update({"g": [(2, 2, _entries(3, 1))]})
    assert _write(image, tmp_path, 4)[1].base is None


@pytest.mark.parametrize("damage", ["gone", "another file", "a byte"])
def test_a_delta_whose_base_is_gone_another_file_or_damaged_is_refused_naming_both(tmp_path: Path,
                                                                                   damage: str) -> None:
    image = _image_of(20)
    base, _info = _write(image, tmp_path, 1)
    image.update({"g": [(3, 3, _entries(2, 1))]})
    delta, info = _write(image, tmp_path, 2)
    assert info.base == GlobalTime(1, 0)
    if damage == "gone":
        base.unlink()
    elif damage == "another file":
        write_snapshot(base, {"g": [(3, 3, _entries(1, 2))]}, boundary=GlobalTime(1, 0), worker=0, tick=0)
    else:
        data = bytearray(base.read_bytes())
        data[-5] ^= 1
        base.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=f"snapshot {delta} builds on {base}"):
        read_snapshot(delta)


def test_retention_keeps_the_chains_of_the_kept_snapshots_and_nothing_else(tmp_path: Path) -> None:
    """Two workers' chains with different roots, written into the same boundary directories (a shared disk): the
    files the newest two snapshots build on stay, alone in their directories, and the rest goes."""
    images = [_image_of(50), _image_of(50)]
    for n in range(1, 8):
        for worker, image in enumerate(images):
            if worker == 1 and n == 3:
                image = images[1] = _image_of(50)  # a new image (a failed write): its next file is whole
            image.update({"g": [(n, n, _entries(n, 1))]})
            at = GlobalTime(n, 0)
            image.write(snapshot_path(tmp_path, at, worker), boundary=at, worker=worker, tick=0)
    (snapshot_dir(tmp_path, GlobalTime(2, 0)) / "worker-7.snap.tmp").write_bytes(b"torn")
    kept = [GlobalTime(6, 0), GlobalTime(7, 0)]
    needed = _needed(tmp_path, kept)
    # worker 0's chain goes back to its root at 1, worker 1's to its new root at 3
    assert needed == ({snapshot_path(tmp_path, GlobalTime(n, 0), 0) for n in range(1, 8)} |
                      {snapshot_path(tmp_path, GlobalTime(n, 0), 1) for n in range(3, 8)})
    for n in range(1, 6):
        _prune(snapshot_dir(tmp_path, GlobalTime(n, 0)), needed)
    left = {path for path in (tmp_path / "snapshots").rglob("*") if path.is_file()}
    assert left == needed
    for at in kept:
        for worker in (0, 1):
            assert read_snapshot(snapshot_path(tmp_path, at, worker))[0].boundary == at
    assert base_path(snapshot_path(tmp_path, GlobalTime(7, 0), 1), GlobalTime(3, 0)) in needed


def _recovery_tick(number: int) -> Tick:
    return Tick(number=number, start=GlobalTime(8000, 0), graph={}, layout=Layout.even(2), workers=("w:1", "w:2"),
                fronts=(0,), acker="a:1", barriers=((0, "b:1"),))


def test_retention_leaves_a_file_above_the_oldest_kept_that_a_worker_has_not_registered_yet(
        tmp_path: Path, zookeeper: str, cluster_name: str) -> None:
    """A recovery tick writes into the directories of boundaries its crashed predecessor reached (which registered
    them, one worker alone).  Its worker 0 has written its delta at 11 and not registered it yet when worker 1's
    retention forgets the old tick's registrations: the file stays, and the deltas built on it stay loadable."""
    at = [GlobalTime(s * 1000, 0) for s in range(14)]

    def state(version: int) -> WorkerState:
        return {"g": [(k, k, _entries(version, 1)) for k in range(20)]}

    with ClusterStore(zookeeper, cluster=cluster_name) as store:
        for worker in (0, 1):  # the crashed tick 1: complete at 8, then worker 0 alone at 11
            write_snapshot(snapshot_path(tmp_path, at[8], worker), state(8), boundary=at[8], worker=worker, tick=1)
            store.register_snapshot(1, boundary_name(at[8]), worker, {})
        write_snapshot(snapshot_path(tmp_path, at[11], 0), state(11), boundary=at[11], worker=0, tick=1)
        store.register_snapshot(1, boundary_name(at[11]), 0, {})
        images = [SnapshotImage(), SnapshotImage()]

        def write(worker: int, s: int, register: bool = True) -> SnapshotInfo:
            images[worker].update({"g": [(s, s, _entries(s, 1))]})
            info = images[worker].write(snapshot_path(tmp_path, at[s], worker), boundary=at[s], worker=worker, tick=2)
            if register:
                store.register_snapshot(2, boundary_name(at[s]), worker, {})
            return info

        for image in images:
            image.update(state(8))
        for s in (9, 10):
            for worker in (0, 1):
                write(worker, s)
        assert write(0, 11, register=False).base == at[10]
        workers = [WorkerService(i, LocalEndpoints(), store, tmp_path, snapshot_retention=2) for i in (0, 1)]
        workers[1]._retain(_recovery_tick(2))
        store.register_snapshot(2, boundary_name(at[11]), 0, {})
        write(1, 11)
        for s in (12, 13):
            for worker in (0, 1):
                write(worker, s)
        workers[0]._retain(_recovery_tick(2))
        kept = store.complete_snapshots(2, 2)
    assert kept == [boundary_name(at[12]), boundary_name(at[13])]
    for name in kept:
        for worker in (0, 1):
            assert read_snapshot(tmp_path / "snapshots" / name / f"worker-{worker}.snap")[0].keys == 20
    assert not snapshot_dir(tmp_path, at[8]).exists()  # below every chain: gone


def test_retention_deletes_nothing_while_a_kept_files_header_does_not_read(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A header that does not read (a file descriptor short, a bad sector) hides what the file builds on: nothing
    goes that round.  One that is gone for good builds on nothing."""
    image = _image_of(20)
    for n in (1, 2, 3):
        image.update({"g": [(n, n, _entries(n, 1))]})
        _write(image, tmp_path, n)
    real = service_module.read_snapshot_header

    def short_of_descriptors(path: Path) -> SnapshotInfo:
        if path.parent.name == boundary_name(GlobalTime(2, 0)):
            raise SnapshotError(f"snapshot {path} cannot be read") from OSError(24, "Too many open files")
        return real(path)

    monkeypatch.setattr(service_module, "read_snapshot_header", short_of_descriptors)
    with pytest.raises(SnapshotError, match="cannot be read"):
        _needed(tmp_path, [GlobalTime(3, 0)])
    monkeypatch.setattr(service_module, "read_snapshot_header", real)
    snapshot_path(tmp_path, GlobalTime(1, 0), 0).unlink()
    assert _needed(tmp_path, [GlobalTime(3, 0)]) == {snapshot_path(tmp_path, GlobalTime(n, 0), 0) for n in (1, 2, 3)}


def test_keys_that_do_not_equal_themselves_are_written_whole_and_a_wrong_chain_is_refused(tmp_path: Path) -> None:
    """A key with a NaN in it is found by a reader by equality, which it fails: its changes go into a whole file.
    And a chain whose sum differs from its header's counts is refused rather than loaded."""
    nan_key = (7, float("nan"))
    image = SnapshotImage()
    image.update({"g": [(1, nan_key, _entries(1, 1)), (2, "plain", _entries(1, 1))]})
    _write(image, tmp_path, 1)
    image.update({"g": [(1, nan_key, _entries(2, 2))]})
    path, info = _write(image, tmp_path, 2)
    assert info.base is None
    state = read_snapshot(path)[1]["g"]
    assert len(state) == 2 and [len(entries) for _h, key, entries in state if key != "plain"] == [2]
    image.update({"g": [(2, "plain", _entries(3, 1))]})
    delta, info = _write(image, tmp_path, 3)
    assert info.base == GlobalTime(2, 0)
    assert len(read_snapshot(delta)[1]["g"]) == 2  # the NaN key's bucket once: whole files read as written


@pytest.mark.parametrize("header", [
    b'{"version": 5, "boundary": [Infinity, 0], "worker": 0, "tick": 0, "keys": 0, "items": 0, "body_bytes": 0, '
    b'"sha256": ""}',
    b'{"version": 5, "boundary": [1, 0], "worker": 0, "tick": 0, "keys": 0, "items": 0, "body_bytes": 0, '
    b'"sha256": "", "base": {"boundary": [0, 0], "sha256": 5}}',
    # Nested past the default recursion limit, in a field that is wrong however deep a raised limit lets it parse.
    b'{"version": 5, "boundary": ' + b"[" * 1500 + b"]" * 1500 + b"}",
    b'{"version": "' + b"x" * 5000 + b'"}',
])
def test_a_crafted_header_is_a_snapshot_error_for_retention_and_readers(tmp_path: Path, header: bytes) -> None:
    path = snapshot_path(tmp_path, GlobalTime(1, 0), 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(snapshots.MAGIC + header + b"\n")
    with pytest.raises(SnapshotError, match="damaged header"):
        read_snapshot_header(path)
    with pytest.raises(SnapshotError, match=r"damaged header|has format version x"):  # read whole, the long one
        read_snapshot(path)
