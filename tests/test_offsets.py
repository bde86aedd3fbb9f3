"""A partition's committed offsets (``flamestream.storage.offsets``): durable per commit, reopened with the
partition, bounded, a damaged file moved aside, and a failed write leaves the offsets as they were.  Real files;
the full disk is a small tmpfs."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from flamestream.storage.offsets import DAMAGED_FILE, MAX_GROUPS, OFFSETS_FILE, CommittedOffsets, TooManyGroups
from tests.disks import tmpfs


def test_offsets_round_trip_per_group_and_survive_a_reopen(tmp_path: Path) -> None:
    offsets = CommittedOffsets(tmp_path)
    assert offsets.get("g1") is None
    offsets.commit("g1", 10)
    offsets.commit("g2", 40)
    offsets.commit("g1", 15)  # a later commit replaces an earlier one, also a lower offset (a rewind)
    offsets.commit("g1", 12)
    assert (offsets.get("g1"), offsets.get("g2"), offsets.get("g3")) == (12, 40, None)
    reopened = CommittedOffsets(tmp_path)
    assert (reopened.get("g1"), reopened.get("g2"), reopened.get("g3")) == (12, 40, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [OFFSETS_FILE]  # no temporary file left behind


def test_a_partition_holds_at_most_max_groups(tmp_path: Path) -> None:
    offsets = CommittedOffsets(tmp_path)
    for i in range(MAX_GROUPS):
        offsets.commit(f"g{i}", i)
    with pytest.raises(TooManyGroups):
        offsets.commit("one-more", 0)
    offsets.commit("g0", 5)  # a known group still commits
    assert CommittedOffsets(tmp_path).get("g0") == 5 and CommittedOffsets(tmp_path).get("one-more") is None
    with pytest.raises(ValueError, match="non-negative"):
        offsets.commit("g0", -1)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"g": -1}', b'{"g": "7"}', b'{"g": 1.5}',
                                     b'{"g": true}', b"\xff\xfe"])
def test_a_damaged_file_is_moved_aside_and_its_groups_start_over(tmp_path: Path, content: bytes) -> None:
    (tmp_path / OFFSETS_FILE).write_bytes(content)
    offsets = CommittedOffsets(tmp_path)
    assert offsets.damaged is not None and f"{OFFSETS_FILE} is damaged" in offsets.damaged
    assert (tmp_path / DAMAGED_FILE).read_bytes() == content and not (tmp_path / OFFSETS_FILE).exists()
    assert offsets.get("g") is None
    offsets.commit("g", 4)
    reopened = CommittedOffsets(tmp_path)
    assert reopened.damaged is None and reopened.get("g") == 4


def test_a_commit_on_a_full_disk_fails_and_keeps_the_last_offsets(tmp_path: Path) -> None:
    def group(i: int) -> str:
        return f"group-{i}-{'n' * 200}"

    with tmpfs(tmp_path / "disk", "64k") as disk:
        offsets = CommittedOffsets(disk)
        offsets.commit("g", 3)
        (disk / "filler").write_bytes(b"x" * 56 * 1024)  # leaves a page or two: the file outgrows them
        committed = 0
        with pytest.raises(OSError) as failed:
            while True:
                offsets.commit(group(committed), committed)
                committed += 1
        assert failed.value.errno == errno.ENOSPC and 0 < committed < MAX_GROUPS
        for view in (offsets, CommittedOffsets(disk)):
            assert view.get("g") == 3 and view.get(group(committed)) is None
            assert view.get(group(committed - 1)) == committed - 1


def test_adopted_offsets_are_written_once_even_when_there_are_none(tmp_path: Path) -> None:
    offsets = CommittedOffsets(tmp_path / "a")
    (tmp_path / "a").mkdir()
    assert not offsets.stored
    offsets.adopt({})
    assert offsets.stored and CommittedOffsets(tmp_path / "a").get("g") is None
    many = CommittedOffsets(tmp_path)
    many.adopt({f"g{i:04}": i for i in range(MAX_GROUPS + 5)})
    reopened = CommittedOffsets(tmp_path)
    assert reopened.get("g0000") == 0 and reopened.get(f"g{MAX_GROUPS - 1:04}") == MAX_GROUPS - 1
    assert reopened.get(f"g{MAX_GROUPS:04}") is None  # the first MAX_GROUPS by name
    with pytest.raises(ValueError, match="non-negative"):
        CommittedOffsets(tmp_path / "a").adopt({"g": -1})
