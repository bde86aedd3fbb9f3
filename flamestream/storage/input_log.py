"""The fronts' durable input log: the record format and a reader.

Every admitted event is appended (and fsynced) before the client hears back,
with the global time and per-millisecond sequence number the front stamped on
it.  Those three numbers rebuild the item exactly — global time (ts, front) and
initial trace ``(seq,)`` — so replaying the log (the oracle check, Spark replay,
recovery) reproduces the stream's deterministic output.

Retention: once a complete snapshot below a boundary T exists, the events
below T are needed only by replays from older snapshots, so the front deletes
the log's sealed segments whose events are *all* below the oldest retained
complete snapshot (``plan_truncation``, then ``SegmentedLog.truncate_before``).
The truncation marker keeps what the front must not forget about them
(``Truncation``): the newest global time deleted, so a replay can tell whether
the log still covers where it starts; the last timestamp, so a restarted front
never stamps below it; and each producer's last sequence, so a retry of an event
whose record is gone is still recognised as a retry instead of admitted twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson

from flamestream.core.front import Stamped
from flamestream.core.meta import GlobalTime
from flamestream.core.payload import decode_payload, encode_json
from flamestream.storage.log import LogError, SegmentedLog, read_start, write_durably


def encode_record(gt: GlobalTime, seq: int, payload: Any, producer: str = "", sequence: int = 0) -> bytes:
    """One record of the log: the admitted event and what reproduces its global time, trace and producer."""
    return encode_json({"ts": gt.ts, "front": gt.front, "seq": seq, "producer": producer, "sequence": sequence,
                        "payload": payload})


def decode_record(data: bytes) -> dict[str, Any]:
    """One record of the log, read as ``decode_payload`` reads a payload: orjson where it reads what ``json``
    does, ``json`` for the rest (an integer beyond 64 bits, which orjson would turn into a float — the oracle,
    Spark replay and a recovery's re-send would then see another event than the workers did — and the
    NaN/Infinity older fronts wrote).  Why not ``json`` alone: a restarted front reads its log back before it
    serves (the producers' sequences), and orjson reads it several times faster."""
    record: dict[str, Any] = decode_payload(data)
    return record


def front_log_dir(data_dir: Path, front: int) -> Path:
    return data_dir / "input" / f"front-{front}"


def read_input_log(directory: Path) -> Iterator[Stamped]:
    """Stamped events of one front's input log, in the order they were admitted."""
    log = SegmentedLog(directory, readonly=True)
    try:
        for _, data in log.scan():
            r = decode_record(data)
            yield r["front"], GlobalTime(r["ts"], r["front"]), (r["seq"],), r["payload"]
    finally:
        log.close()


def read_input_logs(data_dir: Path) -> list[Stamped]:
    """Every front's input log under a cluster data dir (``DIR/input/front-<id>``) or its ``input`` dir."""
    base = data_dir / "input" if (data_dir / "input").is_dir() else data_dir
    stamped: list[Stamped] = []
    for directory in sorted(p for p in base.glob("front-*") if p.is_dir()):
        stamped.extend(read_input_log(directory))
    return stamped


# -- retention ---------------------------------------------------------------------------------------------------

@dataclass
class Truncation:
    """What a front's log remembers of the records retention deleted (the marker's meta)."""

    start: int = 0
    """The first offset left."""
    last: GlobalTime | None = None
    """The newest global time deleted: the log holds every event after it (None: nothing was deleted)."""
    last_ts: int = -1
    """The highest timestamp deleted (a restarted front stamps above it)."""
    producers: dict[str, tuple[int, GlobalTime]] = field(default_factory=dict)
    """Producer -> (last sequence, its global time) among the deleted records."""

    def meta(self) -> dict[str, Any]:
        return {"last": None if self.last is None else list(self.last), "last_ts": self.last_ts,
                "producers": {p: [seq, gt.ts, gt.front] for p, (seq, gt) in sorted(self.producers.items())}}

    @classmethod
    def of(cls, start: int, meta: dict[str, Any]) -> Truncation:
        try:
            last = meta.get("last")
            return cls(start, None if last is None else GlobalTime(int(last[0]), int(last[1])),
                       int(meta.get("last_ts", -1)),
                       {str(p): (int(seq), GlobalTime(int(ts), int(front)))
                        for p, (seq, ts, front) in meta.get("producers", {}).items()})
        except (ValueError, TypeError, IndexError, AttributeError) as exc:
            raise LogError(f"the input log's truncation marker is not a front's: {exc!r}") from exc

    def covers_from(self, start: GlobalTime | None) -> bool:
        """Whether the log still holds every event at or after ``start`` (None: from the beginning)."""
        if self.start == 0:
            return True
        return start is not None and self.last is not None and self.last < start


def checkpoint_path(directory: Path) -> Path:
    """Where a front keeps the checkpoint of its log (``write_checkpoint``): beside the log's directory."""
    return directory.parent / f"{directory.name}.checkpoint.json"


def write_checkpoint(directory: Path, state: Truncation) -> None:
    """Durably record what the records of the log at ``directory`` below ``state.start`` leave behind: each
    producer's last sequence and the highest timestamp (``write_durably``: a crash leaves the old file or the new
    one).

    Why: a restarted front rebuilds its producer table before it serves, and reading the whole log back for
    that made every recovery as slow as the log was long (5 s for 300k events on the chaos bench, most of a
    recovery).  From a checkpoint it reads only the records after it.  Same format as the truncation marker's
    meta (``Truncation``), which holds the same facts about the records retention deleted.
    """
    write_durably(checkpoint_path(directory), orjson.dumps({"offset": state.start, "meta": state.meta()}))


def read_checkpoint(directory: Path) -> Truncation | None:
    """The checkpoint ``write_checkpoint`` left, or None if there is none; LogError if it is not one."""
    try:
        data = orjson.loads(checkpoint_path(directory).read_bytes())
        return Truncation.of(int(data["offset"]), data["meta"])
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise LogError(f"{checkpoint_path(directory)} is not a front's checkpoint: {exc!r}") from exc


def truncation(directory: Path) -> Truncation:
    """The truncation state of a front's log directory (start 0 and nothing remembered if never truncated)."""
    return Truncation.of(*read_start(directory))


def check_covers(directory: Path, start: GlobalTime | None) -> None:
    """Raise LogError unless the input log at ``directory`` holds every event at or after ``start``.

    A truncated log without the events before a snapshot is complete for a replay from that snapshot and
    useless for anything earlier: reading it from before would silently miss events.
    """
    state = truncation(directory)
    if state.covers_from(start):
        if start is None:  # segments removed by hand (no marker) leave a gap only a replay from after it survives
            names = sorted(p.name for p in directory.glob("*.log"))
            if names and names[0] != f"{state.start:020d}.log":
                raise LogError(f"{directory}: the input log's first segment is {names[0]}: earlier events are "
                               "gone, so it can only be replayed from a snapshot after them")
        return
    since = "the beginning" if start is None else f"{start.ts}:{start.front}"
    raise LogError(f"{directory}: retention deleted this input log's events up to {_show(state.last)} (offsets "
                   f"below {state.start}), so it cannot be replayed from {since}: start from a snapshot after "
                   f"{_show(state.last)}, e.g. the oldest one retained in DATA_DIR/snapshots")


def _show(gt: GlobalTime | None) -> str:
    return "nothing" if gt is None else f"{gt.ts}:{gt.front}"


def plan_truncation(directory: Path, below: GlobalTime) -> tuple[int, Truncation] | None:
    """Where a front's log may start so that everything deleted is below ``below``, and the marker to record.

    Whole sealed segments only, from the start on: a segment goes if every
    record in it is below ``below`` — a record *at* ``below`` is kept (a
    snapshot below T holds the state of the events before T, not of T's).
    Each segment's last record is read first: at or above ``below`` means the
    segment stays and so do all after it (a front's log is in stamp order), so
    only the segments that do go are read whole — and they must be, for the
    producers' last sequences.  The whole scan still checks every record,
    so a log out of order would only keep more, never lose an event.  None
    if nothing can go.  Read-only: the front truncates under its own lock.
    """
    log = SegmentedLog(directory, readonly=True)
    try:
        start = log.start_offset
        state = Truncation.of(start, log.start_meta)
        bases, end = log.segment_bases, log.end_offset
        cut = start
        for base, successor in pairwise(bases):  # sealed segments: all but the last
            if successor == base or _time(log.read(successor - 1, 1)[0][1]) >= below:
                break
            records = [decode_record(data) for _offset, data in log.scan(base, successor)]
            times = [GlobalTime(r["ts"], r["front"]) for r in records]
            if max(times) >= below:
                break
            for record, gt in zip(records, times, strict=True):
                state.last = gt if state.last is None else max(state.last, gt)
                state.last_ts = max(state.last_ts, gt.ts)
                if record.get("producer"):
                    state.producers[record["producer"]] = (int(record["sequence"]), gt)
            cut = successor
        assert cut <= end
    finally:
        log.close()
    if cut == start:
        return None
    state.start = cut
    return cut, state


def _time(data: bytes) -> GlobalTime:
    record = decode_record(data)
    return GlobalTime(record["ts"], record["front"])


def read_input_range(data_dir: Path, start: GlobalTime, stop: GlobalTime) -> list[Stamped]:
    """Every front's events with global time in [start, stop), in (global time, trace) order.

    What a worker re-processes when a hand-over falls back to an older
    snapshot.  Each front's log is in stamp order, so reading starts at the
    last segment whose first record is below ``start`` and stops at the
    first record at or after ``stop``.  LogError if a log no longer covers
    ``start`` (retention deleted events there).
    """
    base = data_dir / "input" if (data_dir / "input").is_dir() else data_dir
    out: list[Stamped] = []
    for directory in sorted(p for p in base.glob("front-*") if p.is_dir()):
        for attempt in range(3):
            try:
                out.extend(_read_front_range(directory, start, stop))
                break
            except LogError:
                # Retention may delete a segment below ``start`` while it is being looked at (never one holding
                # events at or after ``start``, which a retained snapshot still needs): look again.
                if attempt == 2:
                    raise
    out.sort(key=lambda s: (s[1], s[2]))
    return out


def _read_front_range(directory: Path, start: GlobalTime, stop: GlobalTime) -> list[Stamped]:
    check_covers(directory, start)
    log = SegmentedLog(directory, readonly=True)
    out: list[Stamped] = []
    try:
        first, end = log.start_offset, log.end_offset
        for segment in log.segment_bases:
            if segment < end and _time(log.read(segment, 1)[0][1]) < start:
                first = segment
        for _offset, data in log.scan(first, end):
            r = decode_record(data)
            gt = GlobalTime(r["ts"], r["front"])
            if gt >= stop:
                break
            if gt >= start:
                out.append((r["front"], gt, (r["seq"],), r["payload"]))
    finally:
        log.close()
    return out
