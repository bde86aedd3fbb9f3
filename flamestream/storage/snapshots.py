"""Snapshot files: one worker's grouping state below a boundary, durable and verifiable.

A snapshot is what a new tick (a redeploy, a rescale, a recovery) starts
from, so a file that is torn or bit-rotted must be *detected*, never loaded:
the file carries a format version and a SHA-256, and is written to a
temporary name, fsynced and renamed (then the directory fsynced), so a crash
leaves the old file or the new one.  The checksum covers the header's fields
as well as the body (format 2; format 1 covered the body only and is still
read): a flipped digit in the header would otherwise pass for another
boundary, worker or tick, and a replay would trust it.  The body is
``flamestream.core.values``: exact for tuples and non-string keys, and
decoding can build only plain values (nothing read back may run code).
Since format 3 each grouping is an index of its buckets (hash, key, items,
size) and then their entries, so a restarted worker reads every key and
decodes a bucket's entries only when it needs them (``FrozenBucket``);
formats 1 and 2 hold chunks of whole buckets and are still read.  Since
format 4 the checksum is the SHA-256 of the header's fields and of each
part's own SHA-256 (each grouping's index, each bucket's entries), so a
periodic snapshot hashes only the buckets that changed: hashing the whole
file took 0.09 s of the 0.21 s a write of an 80 MB index cost, every time.

Layout: ``DIR/snapshots/<boundary ts>-<boundary front>/worker-<i>.snap``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from flamestream.core import splice, values
from flamestream.core.grouping import Entries
from flamestream.core.meta import GlobalTime, boundary_name
from flamestream.core.worker import WorkerState
from flamestream.storage.log import write_durably

MAGIC = b"flamestream-snapshot\n"
VERSION = 4
READABLE = (1, 2, 3, 4)
"""Format versions this build reads: 1 checksummed the body only, 2 also the header's fields, 3 writes an index of
each grouping's keys and sizes before their entries (``FrozenBucket``), 4 checksums each part's checksum instead
of the body's bytes."""


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


def snapshot_dir(data_dir: Path, boundary: GlobalTime) -> Path:
    return data_dir / "snapshots" / boundary_name(boundary)


def snapshot_path(data_dir: Path, boundary: GlobalTime, worker: int) -> Path:
    return snapshot_dir(data_dir, boundary) / f"worker-{worker}.snap"


class FrozenBucket(NamedTuple):
    """One bucket of a snapshot file with its entries still encoded: a worker that takes it over decodes them only
    when an item first reaches the key (``Grouping.restore_lazily``), and its next snapshot writes the same bytes.

    Format 3 writes each grouping as an index ``[name, [[h, key, items,
    size], ...]]`` followed by its buckets' entries, ``size`` bytes each, so
    a reader finds every key without decoding what it holds.  Why one index
    and not a header per bucket: a pickler call per header cost 7 us in
    Python around it, a fifth more CPU for a periodic snapshot of the index.
    """

    row: tuple[int, Hashable, int, int]
    """Its row of the index: (h, key, items, size).  Kept built: a write lists every bucket's."""
    body: bytes | memoryview
    """Read from a file, a view of the file's bytes: copying them out cost more than finding them."""
    digest: bytes
    """SHA-256 of ``body``, computed once: every write's checksum covers it (format 4)."""
    source: str
    """The file it came from, to name in an error."""
    row_code: bytes | None = None
    """``row`` as ``values.fragments`` encodes it, for ``SnapshotImage.write`` to join into the grouping's index;
    None for a bucket read from a file (encoded at its next write) or a row ``fragments`` has none for (a key
    too large for one frame, or one that needs the memo)."""
    parts: splice.Parts | None = None
    """Where the parts of its entries are encoded in ``body`` (``splice``), for the bucket's next encoding to copy
    the unchanged ones; None if it was encoded whole or read from a file.  It holds those parts until the bucket
    changes again: the shards a second of postings replaced, at most, beyond what the state holds."""

    @property
    def h(self) -> int:
        return self.row[0]

    @property
    def key(self) -> Hashable:
        return self.row[1]

    def entries(self) -> Entries:
        try:
            return _entries(values.decode(self.body))
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"snapshot {self.source} has a damaged bucket {self.key!r}: {exc}") from exc


Frozen = dict[str, list[FrozenBucket]]
"""Grouping name -> its buckets as a snapshot file holds them (every grouping the file names, even without any)."""


def _entries(encoded: Any) -> Entries:
    return [((GlobalTime(int(ts), int(front)), tuple(int(t) for t in trace)), payload)
            for ts, front, trace, payload in encoded]


def _frozen(buckets: list[tuple[int, Hashable, Entries]], source: str) -> list[FrozenBucket]:
    """``buckets`` encoded as format 3 writes them, through one pickler (a snapshot encodes thousands each second,
    and a pickler per value would cost more than most of them)."""
    bodies = list(values.encode_each(map(_encodable, buckets)))
    return _built(buckets, bodies, [None] * len(bodies), source)


def _encodable(bucket: tuple[int, Hashable, Entries]) -> list[list[Any]]:
    """A bucket's entries as format 3 encodes them: ``[ts, front, trace, payload]`` each."""
    return [[gt.ts, gt.front, list(trace), payload] for (gt, trace), payload in bucket[2]]


def _built(buckets: list[tuple[int, Hashable, Entries]], bodies: list[bytes], parts: list[splice.Parts | None],
           source: str) -> list[FrozenBucket]:
    rows = [(h, key, len(entries), len(body)) for (h, key, entries), body in zip(buckets, bodies, strict=True)]
    return [FrozenBucket(row, body, hashlib.sha256(body).digest(), source, code, mine)
            for row, body, code, mine in zip(rows, bodies, values.fragments(rows), parts, strict=True)]


SPLICE_ABOVE = 4096
"""A changed bucket whose last encoding took at least this many bytes is encoded again through ``splice``, smaller
ones whole.  Splicing an index word's 64 shards costs 24-30 us whatever their size (in batches, at 3,000 pages),
encoding them whole 27 us below 4 KB, 43 us at 4-8 KB, 67 us at 8-12 KB and 85-150 us at 12-32 KB; unsharded
entries stay below 4 KB (``examples/inverted_index.py`` shards a word's postings past 128 pages)."""


class SnapshotImage:
    """One worker's state as of its last snapshot, kept encoded between snapshots: a bucket is encoded when it
    changes, not at every snapshot.

    Why: a periodic snapshot of an inverted index re-encoded every word
    each second (7.8 MB, 0.2 s of GIL-holding pickling in a 20k-word
    state), and that showed in the latency of every record the worker
    handled meanwhile.  A second of pages changes a few thousand words;
    ``update`` takes what ``Worker.snapshot_changes`` reports, and
    ``write`` joins the encoded buckets into an ordinary snapshot file.
    A large bucket that changed is encoded again with what did not change
    copied from its last encoding (``SPLICE_ABOVE``, ``splice``): a common
    word's posting list grows with the index, and one posting changes one of
    its shards.
    """

    def __init__(self) -> None:
        self._groupings: dict[str, dict[Hashable, FrozenBucket]] = {}
        self._items = 0
        """Items in all buckets, kept as buckets come and go: counting them at a write touched every bucket."""
        self.copied = 0
        """Bytes ``update`` copied from earlier encodings rather than encoded (``splice``), for the benchmarks."""

    def update(self, changes: WorkerState) -> None:
        """Apply a change report: a bucket with entries replaces what the image held for its key, one
        without removes it; a grouping the report names exists even if it has no buckets."""
        for name, buckets in changes.items():
            image = self._groupings.setdefault(name, {})
            whole: list[tuple[int, Hashable, Entries]] = []
            large: list[tuple[tuple[int, Hashable, Entries], FrozenBucket]] = []
            for bucket in buckets:
                old = image.get(bucket[1])
                self._drop(old)  # its items leave the count here; ``_put`` counts the new encoding's
                if not bucket[2]:
                    image.pop(bucket[1], None)
                elif old is not None and len(old.body) >= SPLICE_ABOVE:
                    large.append((bucket, old))
                else:
                    whole.append(bucket)
            for frozen in _frozen(whole, "") + self._spliced(large):
                self._put(image, frozen)

    def _spliced(self, large: list[tuple[tuple[int, Hashable, Entries], FrozenBucket]]) -> list[FrozenBucket]:
        """The changed ``large`` buckets encoded with what is unchanged of each copied from its last encoding
        (``splice``); a bucket that cannot be is encoded whole."""
        done = splice.encode_spliced([(_encodable(bucket), old.parts or splice.NO_PARTS, old.body)
                                      for bucket, old in large])
        spliced: list[tuple[int, Hashable, Entries]] = []
        bodies: list[bytes] = []
        parts: list[splice.Parts | None] = []
        whole: list[tuple[int, Hashable, Entries]] = []
        for (bucket, _old), result in zip(large, done, strict=True):
            if result is None:
                whole.append(bucket)
            else:
                spliced.append(bucket)
                bodies.append(result[0])
                parts.append(result[1])
                self.copied += result[2]
        return _built(spliced, bodies, parts, "") + _frozen(whole, "")

    def adopt(self, name: str, bucket: FrozenBucket) -> None:
        """Hold ``bucket`` as it was read from a snapshot: a worker that took it over lazily writes it unchanged
        until it changes, instead of encoding again what it just read (2 s for 89 MB of inverted index)."""
        image = self._groupings.setdefault(name, {})
        self._drop(image.get(bucket.row[1]))
        self._put(image, bucket)

    def _put(self, image: dict[Hashable, FrozenBucket], bucket: FrozenBucket) -> None:
        """Hold ``bucket`` for its key; the caller has taken the items of what it replaces out of the count."""
        image[bucket.row[1]] = bucket
        self._items += bucket.row[2]

    def _drop(self, bucket: FrozenBucket | None) -> None:
        if bucket is not None:
            self._items -= bucket.row[2]

    def write(self, path: Path, *, boundary: GlobalTime, worker: int, tick: int) -> SnapshotInfo:
        """Write the image durably and atomically to ``path``; returns its header."""
        parts: list[bytes | memoryview] = []
        digests: list[bytes] = []
        keys, items = 0, self._items
        for name, image in self._groupings.items():
            index = _index(name, image)
            parts.append(index)
            digests.append(hashlib.sha256(index).digest())
            keys += len(image)
            # C-level loops over the buckets: a Python loop over twenty thousand cost a seventh of a snapshot.
            parts.extend(map(_BODY, image.values()))
            digests.extend(map(_DIGEST, image.values()))
        body_bytes = sum(map(len, parts))
        fields: dict[str, Any] = {"version": VERSION, "boundary": list(boundary), "worker": worker, "tick": tick,
                                  "keys": keys, "items": items, "body_bytes": body_bytes}
        fields["sha256"] = _checksum(fields, (b"".join(digests),))
        write_durably(path, MAGIC + json.dumps(fields).encode() + b"\n", *parts)
        return SnapshotInfo(boundary=boundary, worker=worker, tick=tick, keys=keys, items=items,
                            body_bytes=body_bytes, sha256=fields["sha256"])


def _index(name: str, image: dict[Hashable, FrozenBucket]) -> bytes:
    """A grouping's index ``[name, [row, ...]]``, joined from its buckets' encoded rows; a bucket without one (read
    from a file) gets it here.  Encoded whole while a row has none (``FrozenBucket.row_code``): that row is tried
    again at each write, which only a rare key (larger than a frame) costs."""
    codes = list(map(_ROW_CODE, image.values()))
    if None in codes:  # the Python-level pass only then
        missing = [bucket for bucket in image.values() if bucket.row_code is None]
        for bucket, code in zip(missing, values.fragments([bucket.row for bucket in missing]), strict=True):
            image[bucket.key] = bucket._replace(row_code=code)
        codes = list(map(_ROW_CODE, image.values()))
    head, = values.fragments([name])
    if head is None or None in codes:
        return values.encode([name, list(map(_ROW, image.values()))])
    return values.encode_pair(head, codes)  # None is not among them: checked above


_ROW, _BODY, _DIGEST, _ROW_CODE = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(4)
"""``FrozenBucket`` fields by position, for C-level loops over an image's buckets."""


def _state_of_chunks(body: memoryview) -> WorkerState:
    """The state a body of formats 1 and 2 holds: values ``[name, [h, key, entries]...]``."""
    state: WorkerState = {}
    for chunk in values.decode_all(body):
        name, *buckets = chunk
        mine = state.setdefault(str(name), [])
        for h, key, entries in buckets[0] if buckets else []:
            mine.append((int(h), key, _entries(entries)))
    return state


def _frozen_of_body(data: bytes, start: int, source: str) -> tuple[Frozen, list[bytes]]:
    """The buckets of a format 3 or 4 body, ``data`` from ``start`` on, their entries left encoded: each grouping is
    an index ``[name, [[h, key, items, size], ...]]`` and then its buckets' entries, ``size`` bytes each.  Also the
    SHA-256 of each part, in order: format 4's checksum covers them (``_checksum``)."""
    frozen: Frozen = {}
    digests: list[bytes] = []
    view = memoryview(data)
    stream = io.BytesIO(data)  # shares the bytes, as the views do
    stream.seek(start)
    while (at := stream.tell()) < len(data):
        index = values.decode_next(stream)
        if not isinstance(index, list) or len(index) != 2 or not isinstance(index[1], list):
            raise ValueError(f"byte {at - start}: not a grouping's index")
        mine = frozen.setdefault(str(index[0]), [])
        offset = stream.tell()
        digests.append(hashlib.sha256(view[at:offset]).digest())
        for h, key, items, size in index[1]:
            end = offset + int(size)
            if not offset <= end <= len(data) or int(items) < 0:
                raise ValueError(f"byte {at - start}: a bucket of {size} bytes and {items} items")
            body = view[offset:end]
            digests.append(hashlib.sha256(body).digest())
            mine.append(FrozenBucket((int(h), key, int(items), int(size)), body, digests[-1], source))
            offset = end
        stream.seek(offset)
    return frozen, digests


def _checksum(fields: dict[str, Any], body: Iterable[bytes | memoryview]) -> str:
    """SHA-256 of the header's fields (all but the checksum, in a canonical form) and then ``body``: the body's
    bytes in formats 2 and 3, each part's SHA-256 in format 4."""
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
    info, frozen = read_snapshot_frozen(path)
    return info, {name: [(bucket.h, bucket.key, bucket.entries()) for bucket in buckets]
                  for name, buckets in frozen.items()}


def read_snapshot_frozen(path: Path) -> tuple[SnapshotInfo, Frozen]:
    """``read_snapshot`` with every bucket's entries left encoded, for ``Grouping.restore_lazily``: the file is
    checked whole, its keys are read, nothing else is decoded.  A file of format 1 or 2 is decoded and encoded
    again as format 3 and 4 hold it (once, after an upgrade)."""
    info, fields, data, start = _opened(path)
    version = int(fields["version"])
    body = memoryview(data)[start:]
    if version < 4:  # the checksum covers the body's bytes as they are
        _checked(path, info, hashlib.sha256(body).hexdigest() if version == 1 else _checksum(fields, (body,)))
    try:
        if version < 3:
            return info, {name: _frozen(buckets, str(path)) for name, buckets in _state_of_chunks(body).items()}
        frozen, digests = _frozen_of_body(data, start, str(path))
    except (ValueError, TypeError) as exc:
        if version < 4:
            raise SnapshotError(f"snapshot {path} has a damaged body: {exc}") from exc
        raise SnapshotError(f"snapshot {path} is corrupted: its body does not parse ({exc})") from exc
    if version == 4:
        _checked(path, info, _checksum(fields, digests))
    return info, frozen


def _checked(path: Path, info: SnapshotInfo, expected: str) -> None:
    if expected != info.sha256:
        raise SnapshotError(f"snapshot {path} is corrupted: its checksum does not match")


def _opened(path: Path) -> tuple[SnapshotInfo, dict[str, Any], bytes, int]:
    """The header, its fields, the file's bytes and the body's offset of the snapshot at ``path``, once its magic,
    header and size are right (the checksum is the reader's to check: what it covers depends on the format)."""
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
    body = len(data) - header_end - 1
    if body < info.body_bytes:
        raise SnapshotError(f"snapshot {path} is truncated: {body} of {info.body_bytes} body bytes")
    if body > info.body_bytes:
        raise SnapshotError(f"snapshot {path} is corrupted: {body - info.body_bytes} bytes after its "
                            f"{info.body_bytes}-byte body")
    return info, fields, data, header_end + 1
