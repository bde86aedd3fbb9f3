"""Reading segmented logs (``flamestream.storage.log``) by segment, for Spark tasks.

Both Spark sources — the output topic and the fronts' input log — cut a log
into *slices*: record ranges that never cross a segment, each one Spark task
reading its own files.  The driver only lists segments (file names and index
sizes), so no record passes through it.

The on-disk format is the one ``storage/log.py`` documents: segment
``<base:020d>.log`` holds records ``base, base+1, ...`` framed as ``u32 length,
u32 crc32, payload``; its dense ``.index`` holds each record's u64 byte
position, and a record exists for readers once its index entry does.  This
reader lists the segments that are there instead of requiring the first one to
start at offset 0, so a log whose oldest segments were removed (retention)
still reads from where it begins; segments below the start its truncation
marker records (``start.json``) are being deleted and are left out.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flamestream.storage.log import LogError, read_start

_HEADER = struct.Struct("<II")
_ENTRY = struct.Struct("<Q")
_READ = 1 << 20


@dataclass(frozen=True)
class Segment:
    base: int
    """Offset of its first record."""
    count: int
    """Records published in it (its index entries) when it was listed."""

    @property
    def end(self) -> int:
        return self.base + self.count


def list_segments(directory: Path) -> list[Segment]:
    """The log's segments in offset order, each with the records published in it now."""
    start, _meta = read_start(directory)
    bases = sorted(base for base in (int(p.stem) for p in directory.iterdir()
                                     if p.suffix == ".log" and len(p.stem) == 20 and p.stem.isdigit())
                   if base >= start)
    segments: list[Segment] = []
    for i, base in enumerate(bases):
        try:
            count = (directory / f"{base:020d}.index").stat().st_size // _ENTRY.size
        except FileNotFoundError:
            count = 0  # the writer is between creating a segment and its index
        if i + 1 < len(bases) and base + count != bases[i + 1]:
            raise LogError(f"{directory}: segment {base:020d} indexes {count} records but the next one starts at "
                           f"{bases[i + 1]}: the log is corrupt")
        segments.append(Segment(base, count))
    return segments


def end_offset(directory: Path) -> int:
    """The offset after the last published record (0 for an empty log)."""
    segments = list_segments(directory)
    return segments[-1].end if segments else 0


def slices(segments: list[Segment], start: int, stop: int, max_records: int) -> list[tuple[int, int]]:
    """Ranges [a, b) covering [start, stop) that stay inside one segment and hold at most ``max_records``."""
    out: list[tuple[int, int]] = []
    for segment in segments:
        a, b = max(start, segment.base), min(stop, segment.end)
        while a < b:
            out.append((a, min(b, a + max_records)))
            a = out[-1][1]
    return out


def segment_of(segments: list[Segment], offset: int) -> Segment:
    for segment in segments:
        if segment.base <= offset < segment.end:
            return segment
    raise LogError(f"offset {offset} is in no segment (the log holds {segments[0].base if segments else 0}.."
                   f"{segments[-1].end if segments else 0})")


def read_range(directory: Path, base: int, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """Records [start, stop) of the segment at ``base``, as (offset, payload), read sequentially."""
    if start >= stop:
        return
    index = directory / f"{base:020d}.index"
    with open(index, "rb") as f:
        f.seek((start - base) * _ENTRY.size)
        entry = f.read(_ENTRY.size)
    if len(entry) != _ENTRY.size:
        raise LogError(f"{index} has no entry for offset {start}")
    (position,) = _ENTRY.unpack(entry)
    path = directory / f"{base:020d}.log"
    with open(path, "rb", buffering=_READ) as f:
        f.seek(position)
        for offset in range(start, stop):
            header = f.read(_HEADER.size)
            size, crc = _HEADER.unpack(header) if len(header) == _HEADER.size else (0, 0)
            payload = f.read(size)
            if size == 0 or len(payload) != size or zlib.crc32(payload) != crc:
                raise LogError(f"record {offset} in {path} is corrupt")
            yield offset, payload


def read_one(directory: Path, segments: list[Segment], offset: int) -> bytes:
    """The record at ``offset``."""
    segment = segment_of(segments, offset)
    for _, payload in read_range(directory, segment.base, offset, offset + 1):
        return payload
    raise LogError(f"{directory}: record {offset} is missing")
