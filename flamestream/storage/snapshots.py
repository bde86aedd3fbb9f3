"""Snapshot files: one worker's grouping state below a boundary, durable and verifiable.

A snapshot is what a new tick (a redeploy, a rescale, a recovery) starts
from, so a file that is torn or bit-rotted must be *detected*, never loaded:
the file carries a format version and a SHA-256, and is written to a
temporary name, fsynced and renamed (then the directory fsynced), so a crash
leaves the old file or the new one.  The checksum covers the header's fields
as well as the body (format 2; format 1 covered the body only and is still
read): a flipped digit in the header would otherwise pass for another
boundary, worker or tick, and a replay would trust it.  The body is
``flamestream.core.values`` in chunks of buckets (one bucket each since
``SnapshotImage``; older files hold up to 512): exact for tuples and
non-string keys, and decoding can build only plain values (nothing read back
may run code).

Layout: ``DIR/snapshots/<boundary ts>-<boundary front>/worker-<i>.snap``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flamestream.core import values
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.worker import WorkerState
from flamestream.storage.log import write_durably

MAGIC = b"flamestream-snapshot\n"
VERSION = 2
READABLE = (1, 2)
"""Format versions this build reads: 1 checksummed the body only, 2 also the header's fields."""


class SnapshotError(Exception):
    """A snapshot file is missing, truncated, corrupted or of an unknown format; the message names it."""


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot file says about itself (its header)."""

    boundary: GlobalTime
    worker: int
    tick: int
    keys: int
    """Buckets in it, over all groupings."""
    items: int
    body_bytes: int
    sha256: str


Encoded = dict[str, dict[Hashable, tuple[bytes, int]]]
"""Grouping name -> bucket key -> (the bucket's encoded chunk, items in it): a snapshot's buckets as written."""


def snapshot_dir(data_dir: Path, boundary: GlobalTime) -> Path:
    return data_dir / "snapshots" / boundary_name(boundary)


def snapshot_path(data_dir: Path, boundary: GlobalTime, worker: int) -> Path:
    return snapshot_dir(data_dir, boundary) / f"worker-{worker}.snap"


class SnapshotImage:
    """One worker's state as of its last snapshot, kept encoded between snapshots: a bucket is encoded when it
    changes, not at every snapshot.

    Why: a periodic snapshot of an inverted index re-encoded every word
    each second (7.8 MB, 0.2 s of GIL-holding pickling in a 20k-word
    state), and that showed in the latency of every record the worker
    handled meanwhile.  A second of pages changes a few thousand words;
    ``update`` takes what ``Worker.snapshot_changes`` reports, and
    ``write`` joins the encoded buckets into an ordinary snapshot file —
    each bucket one chunk, so the reader is the same as for a whole state.
    """

    def __init__(self) -> None:
        self._groupings: Encoded = {}

    def update(self, changes: WorkerState, known: Encoded | None = None) -> None:
        """Apply a change report: a bucket with entries replaces what the image held for its key, one
        without removes it; a grouping the report names exists even if it has no buckets.  A bucket whose
        chunk ``known`` holds (one just read from a snapshot with those very entries) takes that chunk as it
        is: a worker that took a snapshot over reports its whole state once, and encoding it again took as
        long as decoding it (2 s for 89 MB of inverted index)."""
        for name, buckets in changes.items():
            image = self._groupings.setdefault(name, {})
            given = known.get(name, {}) if known is not None else {}
            fresh = []
            for h, key, entries in buckets:
                if not entries:
                    image.pop(key, None)
                elif key in given:
                    image[key] = given[key]
                else:
                    fresh.append((h, key, entries))
            chunks = values.encode_each([name, [[h, key, [[gt.ts, gt.front, list(trace), payload]
                                                          for (gt, trace), payload in entries]]]]
                                        for h, key, entries in fresh)
            for (_h, key, entries), chunk in zip(fresh, chunks, strict=True):
                image[key] = (chunk, len(entries))

    def write(self, path: Path, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
        """Write the image durably and atomically to ``path``; returns its header."""
        parts: list[bytes] = []
        keys = items = 0
        for name, image in self._groupings.items():
            parts.append(values.encode([name]))  # a grouping with no buckets still says it exists
            keys += len(image)
            for chunk, count in image.values():
                parts.append(chunk)
                items += count
        body_bytes = sum(map(len, parts))
        fields: dict[str, Any] = {"version": VERSION, "boundary": list(boundary), "worker": worker, "tick": tick,
                                  "keys": keys, "items": items, "body_bytes": body_bytes}
        fields["sha256"] = _checksum(fields, parts)
        write_durably(path, MAGIC + json.dumps(fields).encode() + b"\n", *parts)
        return SnapshotInfo(boundary=boundary, worker=worker, tick=tick, keys=keys, items=items,
                            body_bytes=body_bytes, sha256=fields["sha256"])


def _state(chunks: Iterable[tuple[Any, bytes | None]]) -> tuple[WorkerState, Encoded]:
    """The state a file's chunks hold, and the chunks of its buckets that were written one to a chunk (of those
    whose bytes are given)."""
    state: WorkerState = {}
    encoded: Encoded = {}
    for chunk, data in chunks:
        name, *buckets = chunk
        name = str(name)
        mine = state.setdefault(name, [])
        held = buckets[0] if buckets else []
        for h, key, entries in held:
            mine.append((int(h), key, [((GlobalTime(int(ts), int(front)), tuple(int(t) for t in trace)), payload)
                                       for ts, front, trace, payload in entries]))
        if data is not None and len(held) == 1:
            encoded.setdefault(name, {})[mine[-1][1]] = (data, len(mine[-1][2]))
    return state, encoded


def _checksum(fields: dict[str, Any], body: Iterable[bytes]) -> str:
    """SHA-256 of the header's fields (all but the checksum, in a canonical form) and the body, given in parts
    (format 2)."""
    canonical = json.dumps({k: v for k, v in fields.items() if k != "sha256"}, sort_keys=True,
                           separators=(",", ":")).encode()
    digest = hashlib.sha256(canonical + b"\n")
    for part in body:
        digest.update(part)
    return digest.hexdigest()


def write_snapshot(path: Path, state: WorkerState, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
    """Write ``state`` durably and atomically to ``path``; returns its header."""
    image = SnapshotImage()
    image.update(state)
    return image.write(path, boundary=boundary, worker=worker, tick=tick)


def read_snapshot(path: Path) -> tuple[SnapshotInfo, WorkerState]:
    """The header and state of the snapshot at ``path``; SnapshotError naming the file and what is wrong with it
    if it is not whole and intact (missing, truncated anywhere, a byte changed anywhere, an unknown format)."""
    info, state, _encoded = read_snapshot_encoded(path, chunks=False)
    return info, state


def read_snapshot_encoded(path: Path, *, chunks: bool = True) -> tuple[SnapshotInfo, WorkerState, Encoded]:
    """``read_snapshot``, and its buckets' chunks as written, for ``SnapshotImage.update``'s ``known`` (none with
    ``chunks=False``: copying them out of the file is work only a taker of the image needs)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"snapshot {path} cannot be read: {exc}") from exc
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise SnapshotError(f"snapshot {path} is truncated: {len(data)} bytes, not even its magic")
        raise SnapshotError(f"{path} is not a flamestream snapshot (bad magic)")
    header_end = data.find(b"\n", len(MAGIC))
    if header_end < 0:
        raise SnapshotError(f"snapshot {path} is truncated: {len(data)} bytes end inside its header")
    try:
        fields = json.loads(data[len(MAGIC):header_end])
        if fields["version"] not in READABLE:
            raise SnapshotError(f"snapshot {path} has format version {fields['version']}; this build reads "
                                f"{', '.join(map(str, READABLE))}")
        info = SnapshotInfo(boundary=GlobalTime(*map(int, fields["boundary"])), worker=int(fields["worker"]),
                            tick=int(fields["tick"]), keys=int(fields["keys"]), items=int(fields["items"]),
                            body_bytes=int(fields["body_bytes"]), sha256=str(fields["sha256"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"snapshot {path} has a damaged header: {exc!r}") from exc
    body = data[header_end + 1:]
    if len(body) < info.body_bytes:
        raise SnapshotError(f"snapshot {path} is truncated: {len(body)} of {info.body_bytes} body bytes")
    if len(body) > info.body_bytes:
        raise SnapshotError(f"snapshot {path} is corrupted: {len(body) - info.body_bytes} bytes after its "
                            f"{info.body_bytes}-byte body")
    expected = hashlib.sha256(body).hexdigest() if fields["version"] == 1 else _checksum(fields, (body,))
    if expected != info.sha256:
        raise SnapshotError(f"snapshot {path} is corrupted: its checksum does not match")
    try:
        decoded: Iterable[tuple[Any, bytes | None]] = (
            values.decode_chunks(body) if chunks else ((value, None) for value in values.decode_all(body)))
        return (info, *_state(decoded))
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"snapshot {path} has a damaged body: {exc}") from exc
