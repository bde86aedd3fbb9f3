"""Tests for the durable segmented log: offsets, rolls, recovery, readers."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flamestream.storage.log import START_FILE, LogError, SegmentedLog, _past, disk_full, write_durably
from tests.disks import tmpfs


def records(n: int, size: int = 10) -> list[bytes]:
    """Distinct, recognisable payloads so a shifted offset can't go unnoticed."""
    return [f"r{i:06d}".encode().ljust(size, b"x") for i in range(n)]


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == suffix)


def read_all(log: SegmentedLog) -> list[bytes]:
    return [payload for _, payload in log.read(0, max_records=10**9)]


def test_round_trip(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path / "log") as log:
        assert log.append(b"alpha") == 0
        assert log.append(b"beta") == 1
        assert log.append_many([b"gamma", b"delta"]) == 2
        assert log.end_offset == 4
        assert log.read(0) == [(0, b"alpha"), (1, b"beta"), (2, b"gamma"), (3, b"delta")]
        assert log.read(2, max_records=1) == [(2, b"gamma")]
        assert log.read(4) == []


def test_empty_batch_returns_end_offset_and_writes_nothing(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append(b"a")
        assert log.append_many([]) == 1
        assert log.end_offset == 1
        assert read_all(log) == [b"a"]


def test_empty_log(tmp_path: Path) -> None:
    directory = tmp_path / "nested" / "log"
    with SegmentedLog(directory) as log:
        assert log.end_offset == 0
        assert log.read(0) == []
    assert [p.name for p in segment_files(directory)] == [f"{0:020d}.log"]
    with SegmentedLog(directory) as log:
        assert log.end_offset == 0
        assert log.append(b"first") == 0


def test_dense_offsets_across_segment_rolls(tmp_path: Path) -> None:
    data = records(50)  # 18-byte frames, at most 3 per 64-byte segment
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        offsets = [log.append(r) for r in data[:20]]
        assert log.append_many(data[20:]) == 20
        assert offsets == list(range(20))
        assert log.read(0, max_records=100) == list(enumerate(data))
    logs = segment_files(tmp_path)
    assert len(logs) == 17
    assert [int(p.stem) for p in logs] == list(range(0, 50, 3))
    assert all(p.stat().st_size <= 64 for p in logs)
    assert len(segment_files(tmp_path, ".index")) == 17


def test_segment_may_be_filled_exactly(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=54) as log:  # room for exactly three 18-byte frames
        log.append_many(records(7))
    assert [(int(p.stem), p.stat().st_size) for p in segment_files(tmp_path)] == [(0, 54), (3, 54), (6, 18)]


def test_persistence_across_reopen(tmp_path: Path) -> None:
    data = records(30)
    with SegmentedLog(tmp_path, segment_bytes=100) as log:
        log.append_many(data[:10])
    with SegmentedLog(tmp_path, segment_bytes=100) as log:
        assert log.end_offset == 10
        assert log.append_many(data[10:]) == 10
    with SegmentedLog(tmp_path, segment_bytes=100) as log:
        assert log.end_offset == 30
        assert read_all(log) == data


def test_read_from_middle_of_every_segment(tmp_path: Path) -> None:
    data = records(40, size=20)  # 28-byte frames, 4 per segment
    with SegmentedLog(tmp_path, segment_bytes=120) as log:
        log.append_many(data)
        bases = [int(p.stem) for p in segment_files(tmp_path)]
        assert bases == list(range(0, 40, 4))
        for base in bases:
            middle = base + 2
            got = log.read(middle, max_records=5)
            assert got == [(o, data[o]) for o in range(middle, min(middle + 5, 40))]


def test_record_larger_than_segment(tmp_path: Path) -> None:
    big = bytes(range(256)) * 40  # 10 KiB
    with SegmentedLog(tmp_path, segment_bytes=1000) as log:
        assert log.append(b"small") == 0
        assert log.append(big) == 1
        assert log.append(b"after") == 2
        assert log.read(0) == [(0, b"small"), (1, big), (2, b"after")]
    assert [int(p.stem) for p in segment_files(tmp_path)] == [0, 1, 2]
    with SegmentedLog(tmp_path, segment_bytes=1000) as log:
        assert log.read(1, max_records=1) == [(1, big)]


def test_invalid_offsets_are_rejected(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append_many([b"a", b"b"])
        with pytest.raises(ValueError, match="non-negative, got -1"):
            log.read(-1)
        with pytest.raises(ValueError, match=r"offset 3 is beyond the end of the log \(end_offset is 2\)"):
            log.read(3)
        with pytest.raises(ValueError, match="max_records must be positive"):
            log.read(0, max_records=0)
        assert log.read(2) == []


def test_invalid_records_and_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="segment_bytes must be positive"):
        SegmentedLog(tmp_path, segment_bytes=0)
    with SegmentedLog(tmp_path) as log:
        log.append(b"keep")
        with pytest.raises(ValueError, match="empty records are not allowed"):
            log.append_many([b"fine", b""])
        # The batch was validated before anything was written.
        assert log.end_offset == 1
        assert read_all(log) == [b"keep"]


def torn_setup(directory: Path, n: int = 11) -> tuple[list[bytes], Path]:
    """18-byte frames, 3 per segment: with 11 records the last segment holds records 9 and 10."""
    data = records(n)
    with SegmentedLog(directory, segment_bytes=64) as log:
        log.append_many(data)
    return data, segment_files(directory)[-1]


@pytest.mark.parametrize("cut", [1, 5, 8, 12], ids=["1-byte", "mid-header", "header-only", "mid-payload"])
def test_torn_tail_truncated_record_is_dropped(tmp_path: Path, cut: int) -> None:
    data, last = torn_setup(tmp_path)
    good_size = last.stat().st_size - 18  # 18-byte frames: keep the previous records
    os.truncate(last, good_size + cut)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.end_offset == 10
        assert read_all(log) == data[:10]
        assert last.stat().st_size == good_size
        assert log.append(b"replacement") == 10
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert read_all(log) == [*data[:10], b"replacement"]


def test_torn_tail_crc_mismatch_is_dropped(tmp_path: Path) -> None:
    data, last = torn_setup(tmp_path)
    raw = bytearray(last.read_bytes())
    raw[-1] ^= 0xFF
    last.write_bytes(bytes(raw))
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.end_offset == 10
        assert read_all(log) == data[:10]
        assert log.append_many([b"x1", b"x2"]) == 10
        assert log.read(8) == [(8, data[8]), (9, data[9]), (10, b"x1"), (11, b"x2")]


def test_zero_filled_tail_is_dropped(tmp_path: Path) -> None:
    data, last = torn_setup(tmp_path)
    with open(last, "ab") as f:
        f.write(bytes(64))
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert read_all(log) == data
        assert log.append(b"next") == 11


def test_torn_tail_emptying_last_segment_keeps_offsets(tmp_path: Path) -> None:
    data, last = torn_setup(tmp_path, n=10)  # last segment holds only record 9
    assert int(last.stem) == 9
    os.truncate(last, 4)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.end_offset == 9
        assert log.append(b"again") == 9
        assert log.read(8) == [(8, data[8]), (9, b"again")]


def test_missing_indexes_are_rebuilt(tmp_path: Path) -> None:
    data = records(20)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(data)
    originals = {p.name: p.read_bytes() for p in segment_files(tmp_path, ".index")}
    assert len(originals) == 7
    for p in segment_files(tmp_path, ".index"):
        p.unlink()
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.end_offset == 20
        assert log.read(10, max_records=4) == [(o, data[o]) for o in range(10, 14)]
    assert {p.name: p.read_bytes() for p in segment_files(tmp_path, ".index")} == originals


def test_inconsistent_indexes_are_rebuilt(tmp_path: Path) -> None:
    data = records(20)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(data)
    indexes = segment_files(tmp_path, ".index")
    originals = [p.read_bytes() for p in indexes]
    indexes[1].write_bytes(struct.pack("<QQQ", 0, 7, 999))  # right length, wrong positions
    indexes[2].write_bytes(originals[2][:8])  # too short
    indexes[-1].write_bytes(b"")  # last segment's index lost its unsynced entries
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert read_all(log) == data
    assert [p.read_bytes() for p in indexes] == originals


def active(tmp_path: Path, n: int = 50) -> tuple[list[bytes], Path, Path]:
    """``n`` records in one (active) segment: the data, its log file and its index file."""
    data = records(n)
    with SegmentedLog(tmp_path) as log:
        log.append_many(data[: n // 2])
        log.append_many(data[n // 2 :])
    return data, segment_files(tmp_path)[0], segment_files(tmp_path, ".index")[0]


def test_the_published_records_of_the_active_segment_are_not_rescanned(tmp_path: Path) -> None:
    """Their index entries were written after their fsync: recovery trusts them and scans only what follows.
    Seen through bit rot inside a published record: the reopened log keeps every record after it (a scan would
    cut them all), and the read names the damaged one."""
    data, log_file, _ = active(tmp_path)
    raw = bytearray(log_file.read_bytes())
    raw[5 * (8 + 10) + 8 + 2] ^= 0x01  # inside record 5's payload
    log_file.write_bytes(bytes(raw))
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == 50
        assert log.read(40, max_records=3) == [(o, data[o]) for o in range(40, 43)]
        with pytest.raises(LogError, match=r"record 5 in .* is corrupt"):
            log.read(5, max_records=1)


@pytest.mark.parametrize("damage", ["zero-filled tail", "torn entry", "past the data", "not from 0"])
def test_an_index_that_a_crash_damaged_falls_back_to_the_scan(tmp_path: Path, damage: str) -> None:
    """The active index is not fsynced: a crash can leave it zero-filled, torn or wrong; what the scan finds
    then counts, and the index is rewritten."""
    data, log_file, index_file = active(tmp_path)
    index = index_file.read_bytes()
    damaged = {"zero-filled tail": index[: 20 * 8] + bytes(30 * 8),
               "torn entry": index[: 49 * 8] + struct.pack("<Q", 49 * 18 + 3),  # inside the last record
               "past the data": index[: 49 * 8] + struct.pack("<Q", 10**6),
               "not from 0": struct.pack("<Q", 18) + index[8:]}[damage]
    index_file.write_bytes(damaged)
    with open(log_file, "ab") as f:
        f.write(b"\x05\x00\x00\x00torn")  # and an unpublished, torn frame after the records
    with SegmentedLog(tmp_path) as log:
        assert read_all(log) == data
    assert index_file.read_bytes() == index


def test_corrupt_sealed_segment_is_refused(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(records(10))
    first_log = segment_files(tmp_path)[0]
    os.truncate(first_log, first_log.stat().st_size - 3)
    with pytest.raises(LogError, match=r"sealed segment .* holds 2 intact records"):
        SegmentedLog(tmp_path, segment_bytes=64)


def test_missing_first_segment_is_refused(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(records(10))
    segment_files(tmp_path)[0].unlink()
    with pytest.raises(LogError, match="first segment starts at offset 3"):
        SegmentedLog(tmp_path, segment_bytes=64)


def test_bit_rot_in_sealed_segment_fails_the_read(tmp_path: Path) -> None:
    data = records(10)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(data)
        first_log = segment_files(tmp_path)[0]
        raw = bytearray(first_log.read_bytes())
        raw[18 + 8 + 2] ^= 0x01  # inside record 1's payload
        first_log.write_bytes(bytes(raw))
        assert log.read(0, max_records=1) == [(0, data[0])]
        with pytest.raises(LogError, match=r"record 1 in .* is corrupt"):
            log.read(0)


def test_reader_sees_writer_appends(tmp_path: Path) -> None:
    data = records(25)
    with SegmentedLog(tmp_path, segment_bytes=64) as writer:
        reader = SegmentedLog(tmp_path, segment_bytes=64, readonly=True)
        assert reader.end_offset == 0
        assert reader.read(0) == []
        writer.append_many(data[:2])
        assert reader.read(0) == [(0, data[0]), (1, data[1])]
        with pytest.raises(ValueError, match="beyond the end"):
            reader.read(3)
        for i in range(2, 25):  # crosses several segment rolls
            writer.append(data[i])
            assert reader.end_offset == i + 1
            assert reader.read(i) == [(i, data[i])]
        assert read_all(reader) == data
        with pytest.raises(LogError, match="read-only"):
            reader.append(b"nope")
        reader.close()
        with pytest.raises(ValueError, match="closed"):
            reader.read(0)


def test_reader_ignores_unpublished_tail(tmp_path: Path) -> None:
    """Bytes without an index entry (a batch in flight, or a torn write) are invisible to readers."""
    data, last = torn_setup(tmp_path)
    with open(last, "ab") as f:
        f.write(b"\x05\x00\x00\x00garbage")
    with SegmentedLog(tmp_path, readonly=True) as reader:
        assert reader.end_offset == 11
        assert read_all(reader) == data
    assert last.stat().st_size == 2 * 18 + 11  # the reader did not repair anything


def test_reader_requires_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SegmentedLog(tmp_path / "missing", readonly=True)
    assert not (tmp_path / "missing").exists()


def test_second_writer_is_refused(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path) as log:
        log.append(b"a")
        with pytest.raises(LogError, match="already open for writing"):
            SegmentedLog(tmp_path)
    with SegmentedLog(tmp_path) as log:  # the lock went away with close()
        assert log.append(b"b") == 1


def test_one_fsync_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    with SegmentedLog(tmp_path) as log:
        monkeypatch.setattr(os, "fsync", counting_fsync)
        log.append_many(records(500))
        assert len(calls) == 1
        log.append(b"one more")
        assert len(calls) == 2


def test_fsync_disabled_never_syncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(fd: int) -> None:
        raise AssertionError("fsync called")

    monkeypatch.setattr(os, "fsync", forbidden)
    with SegmentedLog(tmp_path, segment_bytes=64, fsync=False) as log:
        log.append_many(records(20))
    with SegmentedLog(tmp_path, segment_bytes=64, fsync=False) as log:
        assert read_all(log) == records(20)


def test_failed_append_blocks_writes_until_reopen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentedLog(tmp_path)
    log.append(b"durable")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "simulated EIO")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", failing_fsync)
        with pytest.raises(OSError, match="simulated EIO"):
            log.append(b"unsure")
    with pytest.raises(LogError, match="earlier append failed"):
        log.append(b"later")
    assert log.read(0) == [(0, b"durable")]  # the unsynced record was never published
    log.close()
    with SegmentedLog(tmp_path) as log:
        # The write reached the page cache, so after reopen it is on disk and intact.
        assert read_all(log) == [b"durable", b"unsure"]
        assert log.append(b"later") == 2


def test_written_records_count_and_show_only_once_published(tmp_path: Path) -> None:
    """``write_many`` then ``publish`` is ``append_many`` in two steps (a front sends between them): what is written
    is in no one's ``end_offset`` or reads until published, and a second write must wait for the publication."""
    data = records(25)
    with SegmentedLog(tmp_path, segment_bytes=64) as writer:
        reader = SegmentedLog(tmp_path, segment_bytes=64, readonly=True)
        assert writer.write_many(data[:3]) == 0
        assert writer.end_offset == reader.end_offset == 0
        assert writer.read(0) == [] and reader.read(0) == []
        with pytest.raises(LogError, match="not published yet"):
            writer.write_many(data[3:4])
        writer.publish()
        assert writer.end_offset == reader.end_offset == 3
        assert read_all(reader) == data[:3]
        writer.publish()  # nothing written since: nothing changes
        assert writer.end_offset == 3
        assert writer.write_many(data[3:]) == 3  # across segment rolls: each sealed segment is published on the way
        sealed = reader.end_offset
        assert 3 < sealed < 25
        assert read_all(reader) == data[:sealed]
        writer.publish()
        assert read_all(reader) == data
        reader.close()


def test_written_records_survive_a_close_without_publication(tmp_path: Path) -> None:
    """A process that dies between the write and its fsync leaves the records to the operating system: opening the
    log again keeps them (they are intact), as it keeps a failed append's."""
    with SegmentedLog(tmp_path) as log:
        log.append(b"published")
        log.write_many([b"written", b"too"])
    with SegmentedLog(tmp_path) as log:
        assert read_all(log) == [b"published", b"written", b"too"]


def test_a_failed_publication_fails_the_log_until_reopened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentedLog(tmp_path)
    log.write_many([b"unsure"])

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "simulated EIO")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", failing_fsync)
        with pytest.raises(OSError, match="simulated EIO"):
            log.publish()
    with pytest.raises(LogError, match="earlier append failed"):
        log.write_many([b"later"])
    with pytest.raises(LogError, match="earlier append failed"):
        log.publish()
    assert log.end_offset == 0
    log.close()
    with SegmentedLog(tmp_path) as log:
        assert read_all(log) == [b"unsure"]


def test_closed_log_rejects_use(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path)
    log.close()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append(b"a")
    with pytest.raises(ValueError, match="closed"):
        _ = log.end_offset


payloads = st.binary(min_size=1, max_size=40)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), payloads),
        st.tuples(st.just("append_many"), st.lists(payloads, max_size=8)),
        st.tuples(st.just("reopen"), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, segment_bytes=st.integers(min_value=1, max_value=200), start=st.integers(0, 60))
def test_any_operation_sequence_reads_back_in_order(
    ops: list[tuple[str, object]], segment_bytes: int, start: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        expected: list[bytes] = []
        log = SegmentedLog(directory, segment_bytes=segment_bytes, fsync=False)
        reader = SegmentedLog(directory, readonly=True)
        try:
            for name, arg in ops:
                if name == "append":
                    assert isinstance(arg, bytes)
                    assert log.append(arg) == len(expected)
                    expected.append(arg)
                elif name == "append_many":
                    assert isinstance(arg, list)
                    assert log.append_many(arg) == len(expected)
                    expected.extend(arg)
                else:
                    log.close()
                    log = SegmentedLog(directory, segment_bytes=segment_bytes, fsync=False)
                assert log.end_offset == len(expected)
            assert read_all(log) == expected
            assert read_all(reader) == expected
            offset = min(start, len(expected))
            assert log.read(offset, max_records=7) == list(enumerate(expected))[offset : offset + 7]
        finally:
            log.close()
            reader.close()


def test_scan_reads_a_range_across_segments_in_chunks(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path / "log", segment_bytes=64) as log:
        log.append_many([bytes([i]) * 10 for i in range(50)])
        assert [offset for offset, _ in log.scan()] == list(range(50))
        assert list(log.scan(7, 23, chunk=4)) == [(i, bytes([i]) * 10) for i in range(7, 23)]
        with pytest.raises(LogError, match="not published"):
            list(log.scan(45, 51))


# -- truncation (retention) ------------------------------------------------------------------------------------


def truncated_log(directory: Path, n: int = 20) -> list[bytes]:
    """``n`` records in 3-record segments (bases 0, 3, 6, ...), then truncated before offset 10 (start 9)."""
    data = records(n)
    with SegmentedLog(directory, segment_bytes=64) as log:
        log.append_many(data)
        assert log.truncate_before(10, {"note": "up to 8"}) == 9
    return data


def test_truncate_before_deletes_whole_sealed_segments_and_keeps_offsets(tmp_path: Path) -> None:
    data = records(20)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(data)
        assert log.truncate_before(10, {"note": "up to 8"}) == 9  # the segment holding 10 starts at 9: kept whole
        assert log.start_offset == 9 and log.start_meta == {"note": "up to 8"}
        assert log.segment_bases == [9, 12, 15, 18]
        assert [int(p.stem) for p in segment_files(tmp_path)] == [9, 12, 15, 18]
        assert [int(p.stem) for p in segment_files(tmp_path, ".index")] == [9, 12, 15, 18]
        assert log.read(9, max_records=100) == [(o, data[o]) for o in range(9, 20)]
        assert log.end_offset == 20 and log.append(b"next") == 20  # offsets never shift
        assert log.truncate_before(9) == 9 and log.truncate_before(3) == 9  # at or below the start: no change
        with pytest.raises(ValueError, match="beyond the end"):
            log.truncate_before(22)
    assert json.loads((tmp_path / START_FILE).read_text()) == {"start": 9, "meta": {"note": "up to 8"}}


def test_reading_below_the_start_is_a_clear_error_never_less_data(tmp_path: Path) -> None:
    data = truncated_log(tmp_path)
    for readonly in (False, True):
        with SegmentedLog(tmp_path, segment_bytes=64, readonly=readonly) as log:
            with pytest.raises(LogError, match=r"offset 8 is below the start of the log \(9\): the records before it "
                                               r"were deleted on purpose"):
                log.read(8)
            with pytest.raises(LogError, match="below the start"):
                list(log.scan())  # the default start is 0, not "whatever is left"
            assert [payload for _, payload in log.scan(log.start_offset)] == data[9:]


def test_the_marker_survives_reopening_for_reading_and_writing(tmp_path: Path) -> None:
    data = truncated_log(tmp_path)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert (log.start_offset, log.end_offset, log.start_meta) == (9, 20, {"note": "up to 8"})
        assert log.append_many(records(25)[20:]) == 20
        assert log.truncate_before(19, {"note": "up to 17"}) == 18
    with SegmentedLog(tmp_path, segment_bytes=64, readonly=True) as reader:
        assert (reader.start_offset, reader.end_offset, reader.start_meta) == (18, 25, {"note": "up to 17"})
        assert [payload for _, payload in reader.scan(18)] == (data + records(25)[20:])[18:]


def test_the_active_segment_is_never_deleted(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(records(8))  # bases 0, 3, 6; 6 is active
        assert log.truncate_before(8) == 6
        assert log.segment_bases == [6] and log.read(6) == [(6, records(8)[6]), (7, records(8)[7])]
        log.append_many(records(12)[8:])
        assert log.segment_bases == [6, 9]
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.end_offset == 12 and log.start_offset == 6


def test_a_truncation_interrupted_by_a_crash_is_finished_on_open(tmp_path: Path) -> None:
    """The marker is durable before any segment goes: segments left below it (a crash in between) are ignored
    by readers and deleted by the next writer."""
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(records(20))
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.stem.isdigit() and int(p.stem) < 9}
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.truncate_before(10)
    for name, content in saved.items():  # as if the deletions had never happened
        (tmp_path / name).write_bytes(content)
    with SegmentedLog(tmp_path, segment_bytes=64, readonly=True) as reader:
        assert reader.segment_bases[0] == 9 and reader.start_offset == 9
        with pytest.raises(LogError, match="below the start"):
            reader.read(0)
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        assert log.start_offset == 9
    assert [int(p.stem) for p in segment_files(tmp_path)] == [9, 12, 15, 18]


def test_a_missing_segment_at_or_after_the_start_is_still_corruption(tmp_path: Path) -> None:
    truncated_log(tmp_path)
    (tmp_path / f"{9:020d}.log").unlink()
    with pytest.raises(LogError, match=r"starts at offset 9 \(start.json\) but its first segment starts at 12"):
        SegmentedLog(tmp_path, segment_bytes=64)
    with pytest.raises(LogError, match="segments are missing"):
        SegmentedLog(tmp_path, segment_bytes=64, readonly=True)


def test_a_damaged_marker_is_refused_naming_it(tmp_path: Path) -> None:
    truncated_log(tmp_path)
    (tmp_path / START_FILE).write_text('{"start": ')
    with pytest.raises(LogError, match=r"start\.json is damaged .*cannot tell where the log starts"):
        SegmentedLog(tmp_path, segment_bytes=64)


def test_a_reader_notices_a_truncation_made_after_it_opened(tmp_path: Path) -> None:
    data = records(20)
    with SegmentedLog(tmp_path, segment_bytes=64) as writer:
        writer.append_many(data)
        with SegmentedLog(tmp_path, readonly=True) as reader:
            assert reader.read(0, max_records=2) == [(0, data[0]), (1, data[1])]
            writer.truncate_before(10)
            with pytest.raises(LogError, match=r"offset 0 is below the start of the log \(9\)"):
                reader.read(0)
            assert reader.read(9, max_records=1) == [(9, data[9])]


def test_only_the_writer_truncates(tmp_path: Path) -> None:
    with SegmentedLog(tmp_path, segment_bytes=64) as log:
        log.append_many(records(10))
    with SegmentedLog(tmp_path, readonly=True) as reader, pytest.raises(LogError, match="read-only"):
        reader.truncate_before(5)


def test_scan_backwards_reads_from_the_end_down_to_the_start(tmp_path: Path) -> None:
    records = [f"record {i}".encode() for i in range(25)]
    with SegmentedLog(tmp_path / "log", segment_bytes=64) as log:
        log.append_many(records)
        assert list(log.scan_backwards(chunk=4)) == [(i, records[i]) for i in reversed(range(25))]
        log.truncate_before(log.segment_bases[2])
        start = log.start_offset
        assert start > 0
        assert list(log.scan_backwards(chunk=4)) == [(i, records[i]) for i in reversed(range(start, 25))]


@given(parts=st.lists(st.binary(max_size=8), max_size=8).filter(lambda parts: b"".join(parts)), data=st.data())
def test_what_is_left_after_a_short_write_is_exactly_the_bytes_not_written(parts: list[bytes],
                                                                           data: st.DataObject) -> None:
    whole = b"".join(parts)
    count = data.draw(st.integers(0, len(whole) - 1))
    assert b"".join(_past(parts, count)) == whole[count:]


def test_write_durably_writes_its_parts_in_order_across_writev_batches(tmp_path: Path) -> None:
    parts = [str(i).encode() * (i % 7) for i in range(3000)] + [memoryview(b"tail")]  # three batches, some empty
    write_durably(tmp_path / "f", *parts)
    assert (tmp_path / "f").read_bytes() == b"".join(parts)


def test_write_durably_onto_a_full_disk_raises_and_keeps_the_old_file(tmp_path: Path) -> None:
    """A write longer than the disk's room: writev writes what fits (a short write), the next one raises ENOSPC,
    and the file at the path is still the old one, never a short new one."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        write_durably(disk / "snap", b"old")
        with pytest.raises(OSError) as raised:
            write_durably(disk / "snap", *[bytes([i]) * 65536 for i in range(40)])
        assert disk_full(raised.value)
        assert (disk / "snap").read_bytes() == b"old"
        assert (disk / "snap.tmp").stat().st_size > 0  # it did write part of it before the disk was full
