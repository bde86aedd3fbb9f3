"""Consumer groups' committed offsets in one output-topic partition, kept beside the partition's log.

Why beside the topic and not in ZooKeeper, where they were: a consumer
commits after every batch it processes, so a commit is on its path.  In
ZooKeeper each commit was a quorum write, and while ZooKeeper was unreachable
every consumer waited in ``commit`` although the barrier went on releasing
records (a 5-second pause stalled the chaos harness's consumer for 5-6 s).
The barrier that owns a partition answers ``Commit`` and ``Committed``, and a
restarted barrier reopens its offsets with its topic from the same data dir,
so nothing else needs to reach them.

The whole map is rewritten per commit (``write_durably``: a temporary file,
fsync, rename), so the file always holds one complete map: a crash leaves the
old one or the new one.  A partition takes at most ``MAX_GROUPS`` groups, which
bounds what a commit writes.  A file damaged from outside (an edit, a bad
disk) is moved aside rather than refused: refusing would stop the node with
its front, worker and acker over resume points, and restart it into the same
refusal; its groups resume from offset 0 instead (read again, not lost).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from flamestream.storage.log import LogError, write_durably

OFFSETS_FILE = "offsets.json"
"""In the partition's log directory (the log reads only its own file names there)."""

DAMAGED_FILE = OFFSETS_FILE + ".damaged"
"""Where a damaged offsets file is moved at opening (the last one only), for its owner to look at."""

MAX_GROUPS = 1000
"""Consumer groups a partition keeps offsets for: each commit rewrites all of them (about 300 bytes each at most)."""


class TooManyGroups(Exception):
    """A commit of a new group to a partition that already holds ``MAX_GROUPS``."""


class CommittedOffsets:
    """Group -> the offset it resumes from, for one partition; durable once ``commit`` returns."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / OFFSETS_FILE
        self.damaged: str | None = None
        """Why the file was moved aside to ``DAMAGED_FILE`` at opening (None: it was fine, or absent)."""
        try:
            self._offsets = _load(self._path)
        except LogError as exc:
            os.replace(self._path, directory / DAMAGED_FILE)
            self.damaged, self._offsets = str(exc), {}
        self._lock = threading.Lock()
        """Commits run in threads: one writer at a time shares the temporary file, and the file ends with the map
        of the commit that finished last."""

    @property
    def stored(self) -> bool:
        """Whether the offsets file exists (a commit or an adoption wrote it)."""
        return self._path.exists()

    def adopt(self, offsets: dict[str, int]) -> None:
        """Start from ``offsets`` (group names already checked), the first ``MAX_GROUPS`` by name: written even when
        empty, so it is done once."""
        kept = dict(sorted(offsets.items())[:MAX_GROUPS])
        if any(offset < 0 for offset in kept.values()):
            raise ValueError("offsets must be non-negative")
        with self._lock:
            self._replace(kept)

    def get(self, group: str) -> int | None:
        """The last committed offset, or None if ``group`` never committed here."""
        return self._offsets.get(group)

    def commit(self, group: str, offset: int) -> None:
        """Store ``offset`` as where ``group`` resumes (last write wins); blocks for an fsync, so call it in a thread.

        The map in memory changes only after the file did, so ``get`` never
        answers an offset a crash could take back.
        """
        if offset < 0:
            raise ValueError(f"offset must be non-negative, got {offset}")
        with self._lock:
            if group not in self._offsets and len(self._offsets) >= MAX_GROUPS:
                raise TooManyGroups(f"this partition already holds the offsets of {MAX_GROUPS} consumer groups")
            self._replace({**self._offsets, group: offset})

    def _replace(self, offsets: dict[str, int]) -> None:
        """The file, then the map in memory, become ``offsets`` (with ``_lock`` held)."""
        write_durably(self._path, json.dumps(offsets, sort_keys=True, ensure_ascii=False).encode())
        self._offsets = offsets


def _load(path: Path) -> dict[str, int]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        offsets = json.loads(data)
        if not isinstance(offsets, dict) or not all(
                isinstance(group, str) and type(offset) is int and offset >= 0 for group, offset in offsets.items()):
            raise ValueError("not a map of group names to non-negative offsets")
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise LogError(f"{path} is damaged ({exc}): the consumer groups' offsets cannot be read") from exc
    return offsets
