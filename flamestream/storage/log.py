"""Durable, append-only, segmented record log.

It backs the fronts' input log (an event is acknowledged only after it is
fsynced here, so recovery and the Spark replay see every acknowledged event)
and the barrier's output-topic partitions (consumers read from an offset).

On disk, a log is a directory of segments.  Segment ``<base:020d>.log`` holds
the records whose offsets start at ``base``, each framed as ``u32 length,
u32 crc32(payload), payload`` (little-endian).  Its companion
``<base:020d>.index`` is *dense*: entry ``i`` is the u64 byte position of
record ``base + i``.  Dense rather than sparse because

* finding an offset is one 8-byte read at a computed position, with no binary
  search and no forward scan through the segment;
* the index length *is* the segment's record count, which gives readers in
  other processes an exact "published up to here" mark (see below) and gives
  recovery an exact consistency check;
* 8 bytes per record is small next to the 8-byte frame header every record
  already carries.

Publication protocol: the writer appends a batch's frames to the segment,
fsyncs the segment, and only then appends the batch's index entries.  A reader
treats a record as existing once its index entry does, so it never sees data
that a crash could still take back, and never sees half-written frames.  The
active segment's index is not fsynced (that would cost a second fsync per
batch); recovery rebuilds it from the segment, which is the source of truth.
A segment is sealed (data and index fsynced) before its successor is created,
so only the last segment can have a torn tail.

Recovery on open (writer only): sealed segments get a cheap check (index length
and the extent of the last indexed record) and are rescanned only if that
fails; the last segment is scanned from the end of the records its index
published (``_published``: they were fsynced before their entries were
written), cut back to its last intact record, and its index rewritten if it
disagrees.  Fsynced records are never cut: a torn tail can only consist of
bytes whose fsync had not returned.  (A record corrupted later on the medium,
below the published end, is no longer found at open: a CRC scan of every
restart's whole segment cost a front 0.75 s per 300k events.)

Limitations, by design:

* Empty records are rejected.  Filesystems may leave a crashed file's tail
  zero-filled, and a zero-filled 8-byte header is a valid frame of an empty
  payload (crc32 of nothing is 0), so allowing them would let a crash invent
  records.  Forbidding them makes any zero-length frame an unambiguous tear.
* ``append_many`` is durable as a whole but not atomic across a crash: the
  records before the tear survive recovery even though the batch was never
  acknowledged.  Callers must tolerate an unacknowledged prefix.
* One writer per directory, enforced with ``flock`` (POSIX); any number of
  read-only instances in any process.

Truncation (retention): ``truncate_before(offset)`` deletes whole sealed
segments below ``offset``.  Offsets never shift, so the log then starts at the
base of its first remaining segment, and that start is recorded *before* any
file goes, durably, in ``start.json`` (written to a temporary name, fsynced,
renamed, the directory fsynced): ``{"start": N, "meta": {...}}``.  Why a
marker rather than "whatever the first segment is": a missing first segment
is otherwise indistinguishable from lost data, which recovery must refuse; with
the marker, a gap below N is deliberate and a gap at or above N is still
corruption.  Segments below N that are still there (a crash between writing
the marker and deleting them) are ignored by readers and deleted by the next
writer.  Reading below the start raises ``LogError`` saying the records were
deleted on purpose, never an empty result, so no reader mistakes a truncated
log for a complete one.  ``meta`` is the caller's: what it must remember of the
deleted records (the fronts keep their producers' last sequences there).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import sys
import zlib
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("<II")
_ENTRY = struct.Struct("<Q")
_MAX_RECORD = 0xFFFFFFFF
_LOG_SUFFIX = ".log"
_INDEX_SUFFIX = ".index"
START_FILE = "start.json"
"""The truncation marker: where the log starts and the caller's notes on what went before (module docstring)."""


class LogError(Exception):
    """The log cannot be used as asked: corrupt files, a second writer, or an earlier failed write."""


def _segment_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}{_LOG_SUFFIX}"


def _index_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}{_INDEX_SUFFIX}"


def read_start(directory: Path) -> tuple[int, dict[str, Any]]:
    """The log's start offset and the meta its last truncation recorded: (0, {}) for a log never truncated."""
    try:
        data = (directory / START_FILE).read_bytes()
    except FileNotFoundError:
        return 0, {}
    try:
        marker = json.loads(data)
        start, meta = int(marker["start"]), marker.get("meta", {})
        if start < 0 or not isinstance(meta, dict):
            raise ValueError(f"start {start}, meta {type(meta).__name__}")
    except (ValueError, KeyError, TypeError) as exc:
        raise LogError(f"{directory / START_FILE} is damaged ({exc!r}): cannot tell where the log starts") from exc
    return start, meta


def _list_bases(directory: Path) -> tuple[int, dict[str, Any], list[int]]:
    """(start offset, truncation meta, bases of the segments from the start on), checking nothing is missing."""
    names = [p.name for p in directory.iterdir()]
    start, meta = read_start(directory) if START_FILE in names else (0, {})
    bases = sorted(int(name[: -len(_LOG_SUFFIX)]) for name in names
                   if name.endswith(_LOG_SUFFIX) and len(name) == 20 + len(_LOG_SUFFIX) and name[:20].isdigit())
    bases = [base for base in bases if base >= start]  # below: left by a truncation a crash interrupted
    if bases and bases[0] != start:
        if start:
            raise LogError(f"{directory}: the log starts at offset {start} ({START_FILE}) but its first segment "
                           f"starts at {bases[0]}: segments are missing")
        raise LogError(f"{directory}: first segment starts at offset {bases[0]}, earlier segments are missing")
    if not bases and start:
        raise LogError(f"{directory}: the log starts at offset {start} ({START_FILE}) but has no segment there")
    return start, meta, bases


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, *parts: bytes | memoryview) -> None:
    """``parts``, one after another, at ``path`` or the old file there, whatever crashes when: a temporary name,
    fsync, rename, then the directory fsynced so the rename itself survives a power cut (snapshots, a front's
    checkpoint).  In parts, by ``writev`` (``_write_all``), so a snapshot's tens of thousands of chunks are neither
    first copied into one buffer nor passed through a file object's 8 KiB buffer: that made an 80 MB snapshot
    ten thousand writes, 0.10 s of CPU against 0.05 s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_all(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


IOV_MAX = 1024
"""Parts per ``writev`` (Linux's limit)."""


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """``parts`` written to ``fd`` in order, ``IOV_MAX`` at a time.  A short write (a signal, a quota, a disk about
    to be full) goes on from the byte it stopped at, so a frame or a file is never silently cut: a full disk raises
    on the next ``writev``."""
    for first in range(0, len(parts), IOV_MAX):
        batch = parts[first:first + IOV_MAX]
        left = sum(map(len, batch))
        while left:
            written = os.writev(fd, batch)
            if not written:
                raise OSError(errno.EIO, f"writev wrote nothing of {left} bytes")
            left -= written
            if left:
                batch = _past(batch, written)


def _past(parts: Sequence[bytes | memoryview], count: int) -> list[bytes | memoryview]:
    """``parts`` without their first ``count`` bytes (fewer than they hold)."""
    i = 0
    while count >= len(parts[i]):
        count -= len(parts[i])
        i += 1
    return [memoryview(parts[i])[count:], *parts[i + 1:]]


def _frame(record: bytes) -> bytes:
    size = len(record)
    if size == 0:
        raise ValueError("empty records are not allowed: a zero-length frame is how a torn, zero-filled tail looks")
    if size > _MAX_RECORD:
        raise ValueError(f"record of {size} bytes exceeds the {_MAX_RECORD}-byte frame limit")
    return _HEADER.pack(size, zlib.crc32(record)) + record


def _scan(data: bytes, pos: int = 0) -> tuple[list[int], int]:
    """Positions of the intact records of ``data`` from byte ``pos`` on and the byte where they end."""
    view = memoryview(data)
    positions: list[int] = []
    while pos + _HEADER.size <= len(view):
        size, crc = _HEADER.unpack_from(view, pos)
        end = pos + _HEADER.size + size
        if size == 0 or end > len(view) or zlib.crc32(view[pos + _HEADER.size : end]) != crc:
            break
        positions.append(pos)
        pos = end
    return positions, pos


def _published(index: bytes, data: bytes) -> tuple[int, int]:
    """How many records of the active segment ``data`` its ``index`` published, and the byte where they end:
    recovery scans only what comes after them.

    Why they need no scan: an index entry is written only after its record's fsync returned (the
    publication protocol), so the records it names are intact.  The index itself is not fsynced, so a crash
    can leave its tail zero-filled or torn: only the entries that start at 0 and increase count, and the
    last of them must frame an intact record (size and CRC) inside ``data``.  Anything else: none, and
    recovery scans the whole segment as before.  Scanning 300k records of a front's input log took 0.75 s
    of every restart; reading their index this way takes 25 ms.
    """
    count = len(index) // _ENTRY.size
    if count == 0:
        return 0, 0
    if sys.byteorder != "little":  # the entries are little-endian: read natively, they would be wrong
        return 0, 0
    entries = memoryview(index)[: count * _ENTRY.size].cast("Q")
    trusted, previous = 0, -1
    for position in entries:
        if position <= previous or position >= len(data):
            break
        trusted, previous = trusted + 1, position
    if trusted == 0 or entries[0] != 0:
        return 0, 0
    last = entries[trusted - 1]
    size, crc = _HEADER.unpack_from(data, last) if last + _HEADER.size <= len(data) else (0, 0)
    end = last + _HEADER.size + size
    if size == 0 or end > len(data) or zlib.crc32(memoryview(data)[last + _HEADER.size : end]) != crc:
        return 0, 0
    return trusted, end


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is the disk or the quota running out: a condition freeing space ends."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class SegmentedLog:
    """A directory of segments addressed by dense offsets 0, 1, 2, ... (see the module docstring)."""

    def __init__(
        self,
        directory: Path | str,
        segment_bytes: int = 64 * 1024 * 1024,
        fsync: bool = True,
        readonly: bool = False,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.readonly = readonly
        self._closed = False
        self._failed: BaseException | None = None
        self._bases: list[int] = []
        self._start = 0
        self._start_meta: dict[str, Any] = {}
        self._end = 0
        self._dir_fd = -1
        self._log_fd = -1
        self._index_fd = -1
        self._active_size = 0
        self._written: list[int] = []
        """Positions in the active segment of the records ``write_many`` wrote and ``publish`` has not published."""
        if readonly:
            if not self.directory.is_dir():
                raise FileNotFoundError(f"log directory {self.directory} does not exist")
            self._refresh()
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._dir_fd)
            raise LogError(f"{self.directory} is already open for writing by another SegmentedLog") from None
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    # -- opening -----------------------------------------------------------------

    def _recover(self) -> None:
        self._start, self._start_meta, self._bases = _list_bases(self.directory)
        self._finish_truncation()
        if not self._bases:
            self._create_segment(0)
            return
        for base, successor in zip(self._bases, self._bases[1:], strict=False):
            self._check_sealed(base, successor - base)
        last = self._bases[-1]
        log_path = _segment_path(self.directory, last)
        index_path = _index_path(self.directory, last)
        data = log_path.read_bytes()
        written = index_path.read_bytes() if index_path.exists() else b""
        trusted, start = _published(written, data)
        tail, valid_end = _scan(data, start)
        if valid_end < len(data):
            os.truncate(log_path, valid_end)
        index = written[: trusted * _ENTRY.size] + b"".join(_ENTRY.pack(p) for p in tail)
        if index != written:
            index_path.write_bytes(index)
        self._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        self._index_fd = os.open(index_path, os.O_WRONLY | os.O_APPEND)
        if self.fsync:
            # Make the cut and the rebuilt index durable before new records land after them.
            os.fsync(self._log_fd)
            os.fsync(self._index_fd)
        self._active_size = valid_end
        self._end = last + trusted + len(tail)

    def _check_sealed(self, base: int, count: int) -> None:
        """Trust a sealed segment's index if it is plausible; otherwise rebuild it from the segment."""
        log_path = _segment_path(self.directory, base)
        index_path = _index_path(self.directory, base)
        log_size = log_path.stat().st_size
        if index_path.exists() and index_path.stat().st_size == count * _ENTRY.size:
            with open(index_path, "rb") as f:
                (first,) = _ENTRY.unpack(f.read(_ENTRY.size))
                f.seek((count - 1) * _ENTRY.size)
                (last,) = _ENTRY.unpack(f.read(_ENTRY.size))
            with open(log_path, "rb") as f:
                f.seek(last)
                header = f.read(_HEADER.size)
            if (
                first == 0
                and len(header) == _HEADER.size
                and last + _HEADER.size + _HEADER.unpack(header)[0] == log_size
            ):
                return
        positions, valid_end = _scan(log_path.read_bytes())
        if len(positions) != count or valid_end != log_size:
            raise LogError(
                f"sealed segment {log_path} holds {len(positions)} intact records in {valid_end} of {log_size} bytes, "
                f"expected {count} records filling it: the log is corrupt"
            )
        index_path.write_bytes(b"".join(_ENTRY.pack(p) for p in positions))
        if self.fsync:
            with open(index_path, "rb+") as f:
                os.fsync(f.fileno())

    def _create_segment(self, base: int) -> None:
        # Truncate on create: a leftover index from a crashed roll must not prefix the new one.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC
        self._log_fd = os.open(_segment_path(self.directory, base), flags, 0o644)
        self._index_fd = os.open(_index_path(self.directory, base), flags, 0o644)
        if self.fsync:
            os.fsync(self._dir_fd)
        self._bases.append(base)
        self._active_size = 0

    def _refresh(self) -> None:
        """Re-derive the segment list and end from disk, for a reader following another process's writer."""
        self._start, self._start_meta, self._bases = _list_bases(self.directory)
        if not self._bases:
            self._end = 0
            return
        last = self._bases[-1]
        try:
            published = _index_path(self.directory, last).stat().st_size // _ENTRY.size
        except FileNotFoundError:
            published = 0  # the writer is between creating the segment and its index
        self._end = last + published

    # -- writing -----------------------------------------------------------------

    def append(self, record: bytes) -> int:
        """Append one record durably and return its offset."""
        return self.append_many([record])

    def append_many(self, records: Sequence[bytes]) -> int:
        """Append records with one fsync for the batch (plus one per segment sealed on the way).

        Returns the offset of the first record (``end_offset`` for an empty batch).
        """
        first = self.write_many(records)
        self.publish()
        return first

    def write_many(self, records: Sequence[bytes]) -> int:
        """Write records without their fsync: ``publish`` makes them durable and readable (``append_many`` is the
        two).  Returns the offset the first will have.

        Why two steps: a front sends a push's events to the workers between
        them, so the workers start while the disk syncs (the fsync took
        0.3-0.5 ms of a word count line's 4-5 ms); nothing of the events can
        complete before ``publish``, because the front tells the acker about
        them only afterwards.  A write fails where the disk is full, before
        anything was sent.  Until ``publish`` they are not in ``end_offset``
        and no reader sees them, but they are in the file: a crash of the
        process leaves them to the operating system, and opening the log again
        keeps every intact record (``_recover``).
        """
        self._check_writable()
        if self._written:
            raise LogError("the records written last are not published yet")
        frames = [_frame(r) for r in records]  # validate everything before writing anything
        first = self._end
        try:
            pending: list[bytes] = []
            positions: list[int] = []
            for frame in frames:
                if self._active_size and self._active_size + len(frame) > self.segment_bytes:
                    self._write(pending, positions)
                    self._publish()
                    self._roll()
                    pending, positions = [], []
                positions.append(self._active_size)
                pending.append(frame)
                self._active_size += len(frame)
            self._write(pending, positions)
        except BaseException as exc:
            # Memory and disk may now disagree (and after a failed fsync the page cache cannot be
            # trusted); only reopening, which rescans the disk, restores a state worth writing to.
            self._failed = exc
            raise
        return first

    def publish(self) -> None:
        """Make the records ``write_many`` wrote durable (fsync) and readable (their index entries, then
        ``end_offset``); nothing to do if there are none.  A failure leaves the log failed, as a failed append
        does."""
        self._check_writable()
        try:
            self._publish()
        except BaseException as exc:
            self._failed = exc
            raise

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise LogError(f"{self.directory} was opened read-only")
        if self._failed is not None:
            raise LogError("an earlier append failed; reopen the log to recover a consistent state") from self._failed

    def _write(self, frames: list[bytes], positions: list[int]) -> None:
        if frames:
            _write_all(self._log_fd, frames)
            self._written = positions

    def _publish(self) -> None:
        """The publication protocol (module docstring): the segment fsynced, then the index entries."""
        if not self._written:
            return
        if self.fsync:
            os.fsync(self._log_fd)
        _write_all(self._index_fd, [b"".join(_ENTRY.pack(p) for p in self._written)])
        self._end += len(self._written)
        self._written = []

    def _roll(self) -> None:
        if self.fsync:
            os.fsync(self._index_fd)  # sealed segments are trusted on open, so their index must survive too
        os.close(self._log_fd)
        os.close(self._index_fd)
        self._log_fd = self._index_fd = -1
        self._create_segment(self._end)

    # -- truncation --------------------------------------------------------------

    def truncate_before(self, offset: int, meta: dict[str, Any] | None = None) -> int:
        """Delete the sealed segments wholly below ``offset``; returns the log's start offset afterwards.

        Only whole segments go, and never the active one, so the new start is
        the base of the segment holding ``offset`` (or of the active segment),
        which may be below ``offset``: records are kept rather than cut.  The
        start and ``meta`` (JSON) are made durable before the first file is
        deleted (see the module docstring); asking for a start at or below the
        current one changes nothing.  Not to be called concurrently with
        appends (like them, it is the one writer's).
        """
        self._check_writable()
        if offset < 0 or offset > self._end:
            raise ValueError(f"offset {offset} is beyond the end of the log (end_offset is {self._end})")
        if offset <= self._start:
            return self._start
        start = self._bases[bisect_right(self._bases, offset) - 1]
        if start <= self._start:
            return self._start
        marker = json.dumps({"start": start, "meta": meta or {}}, ensure_ascii=False).encode()
        tmp = self.directory / (START_FILE + ".tmp")
        with open(tmp, "wb") as f:
            f.write(marker)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / START_FILE)
        if self.fsync:
            os.fsync(self._dir_fd)  # the marker is in place before any segment goes
        self._start, self._start_meta = start, dict(meta or {})
        self._finish_truncation()
        return start

    def _finish_truncation(self) -> None:
        """Delete the segments below the start (all of them after ``truncate_before``, leftovers after a crash)."""
        doomed = sorted(base for base in (int(p.stem) for p in self.directory.iterdir()
                                          if p.suffix == _LOG_SUFFIX and len(p.stem) == 20 and p.stem.isdigit())
                        if base < self._start)
        for base in doomed:  # oldest first: an interruption leaves a contiguous run just below the start
            _segment_path(self.directory, base).unlink(missing_ok=True)
            _index_path(self.directory, base).unlink(missing_ok=True)
        if doomed and self.fsync:
            os.fsync(self._dir_fd)
        self._bases = [base for base in self._bases if base >= self._start]

    @property
    def start_offset(self) -> int:
        """The first offset still in the log (0 unless it was truncated); for a reader, as on disk when asked."""
        self._check_open()
        if self.readonly:
            self._refresh()
        return self._start

    @property
    def start_meta(self) -> dict[str, Any]:
        """What the last ``truncate_before`` recorded about the records it deleted ({} if none)."""
        self._check_open()
        if self.readonly:
            self._refresh()
        return dict(self._start_meta)

    @property
    def segment_bases(self) -> list[int]:
        """The base offset of every segment from the start on, in order (the last one is being appended to)."""
        self._check_open()
        if self.readonly:
            self._refresh()
        return list(self._bases)

    # -- reading -----------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """The offset the next appended record will get; for a reader, as published when asked."""
        self._check_open()
        if self.readonly:
            self._refresh()
        return self._end

    def scan(self, start: int = 0, stop: int | None = None, chunk: int = 10_000) -> Iterator[tuple[int, bytes]]:
        """Records [start, stop) (stop: the end when the scan began), read ``chunk`` at a time.

        ``start`` defaults to 0, not to the log's start: a caller that wants the whole history of a truncated
        log gets an error, not silently less (pass ``start_offset`` to read what is left)."""
        end = self.end_offset if stop is None else stop
        offset = start
        while offset < end:
            batch = self.read(offset, min(chunk, end - offset))
            if not batch:
                raise LogError(f"{self.directory}: records {offset}..{end} are not published")
            yield from batch
            offset = batch[-1][0] + 1

    def scan_backwards(self, chunk: int = 1000, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Records from the last one (the one before offset ``end``, if given) down to the log's start, read
        ``chunk`` at a time: for callers that need only the newest records (a recovery's re-send, a topic's last
        global time) in a long log."""
        offset = self.end_offset if end is None else min(end, self.end_offset)
        start = self.start_offset
        while offset > start:
            first = max(start, offset - chunk)
            yield from reversed(self.read(first, offset - first))
            offset = first

    def read(self, from_offset: int, max_records: int = 1000) -> list[tuple[int, bytes]]:
        """Up to ``max_records`` published records from ``from_offset`` on, as (offset, payload) pairs."""
        end = self.end_offset
        if from_offset < 0:
            raise ValueError(f"offset must be non-negative, got {from_offset}")
        if from_offset > end:
            raise ValueError(f"offset {from_offset} is beyond the end of the log (end_offset is {end})")
        if max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        self._check_start(from_offset)
        try:
            return self._read(from_offset, max_records, end)
        except (OSError, LogError):
            if not self.readonly:
                raise
            self._refresh()  # the writer may have truncated the log under this reader
            self._check_start(from_offset)
            raise

    def _check_start(self, offset: int) -> None:
        if offset < self._start:
            raise LogError(f"{self.directory}: offset {offset} is below the start of the log ({self._start}): the "
                           f"records before it were deleted on purpose (retention; see {START_FILE})")

    def _read(self, from_offset: int, max_records: int, end: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        offset = from_offset
        segment = bisect_right(self._bases, offset) - 1
        while offset < end and len(out) < max_records:
            base = self._bases[segment]
            segment_end = self._bases[segment + 1] if segment + 1 < len(self._bases) else end
            count = min(max_records - len(out), segment_end - offset)
            out.extend(self._read_segment(base, offset, count))
            offset += count
            segment += 1
        return out

    def _read_segment(self, base: int, offset: int, count: int) -> list[tuple[int, bytes]]:
        index_path = _index_path(self.directory, base)
        log_path = _segment_path(self.directory, base)
        try:
            with open(index_path, "rb") as f:
                f.seek((offset - base) * _ENTRY.size)
                entry = f.read(_ENTRY.size)
        except FileNotFoundError:
            entry = b""
        if len(entry) != _ENTRY.size:
            raise LogError(f"{index_path} has no entry for offset {offset}; reopen the log for writing to rebuild it")
        (position,) = _ENTRY.unpack(entry)
        out: list[tuple[int, bytes]] = []
        with open(log_path, "rb") as f:
            f.seek(position)
            for current in range(offset, offset + count):
                header = f.read(_HEADER.size)
                size, crc = _HEADER.unpack(header) if len(header) == _HEADER.size else (0, 0)
                payload = f.read(size)
                if size == 0 or len(payload) != size or zlib.crc32(payload) != crc:
                    raise LogError(f"record {current} in {log_path} is corrupt")
                out.append((current, payload))
        return out

    # -- lifecycle ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"log {self.directory} is closed")

    def reopen(self) -> SegmentedLog:
        """This log closed and opened again: what a writer does after a failed append, since only the rescan
        of opening (which cuts a torn tail and fsyncs) tells which of the batch's records reached the disk."""
        self.close()
        return SegmentedLog(self.directory, self.segment_bytes, self.fsync, self.readonly)

    def close(self) -> None:
        """Release the files and the writer lock; idempotent."""
        self._closed = True
        for fd in (self._log_fd, self._index_fd, self._dir_fd):
            if fd >= 0:
                os.close(fd)
        self._log_fd = self._index_fd = self._dir_fd = -1

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
