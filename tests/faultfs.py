"""A disk whose fsync fails on demand: a FUSE file system passing everything through to a directory, except that
``fsync`` answers EIO while a control file exists.

Why FUSE: a failed fsync has to reach the front as the kernel reports it,
through ``os.fsync`` on the file its log really writes, in the process the
cluster really runs; there is no device-mapper here for dm-flakey, and a full
tmpfs fails the *write*, before the fsync (``tests/test_limits_cluster.py``).
Writes go through at once (FUSE without a write-back cache), so what the front
wrote before the failed fsync is in the directory, as a disk's page cache would
still hold it.

    python -m tests.faultfs BACKING MOUNT CONTROL

runs in the foreground until ``MOUNT`` is unmounted (``tests.disks.failing_fsync``).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from fuse import FUSE, FuseOSError, Operations

_STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")


class FailingFsync(Operations):
    """Pass-through to ``backing``; fsync of files and directories fails with EIO while ``control`` exists.  What
    the backing directory raises (an ``OSError``) fusepy answers with its errno, as the kernel would."""

    def __init__(self, backing: str, control: str) -> None:
        self.backing = backing
        self.control = control

    def _path(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _failing(self) -> bool:
        return os.path.exists(self.control)

    # -- metadata ------------------------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._path(path))
        return {field: getattr(st, field) for field in _STAT_FIELDS}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._path(path))
        return {field: getattr(st, field) for field in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                          "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._path(path), amode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._path(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._path(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        os.utime(self._path(path), times)

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._path(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._path(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._path(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._path(old), self._path(new))

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        if fh is None:
            os.truncate(self._path(path), length)
        else:
            os.ftruncate(fh, length)

    # -- files ---------------------------------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        # Writes come with their offset (the kernel keeps the size), so the backing file is not opened to append.
        return os.open(self._path(path), flags & ~os.O_APPEND)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        # fusepy does not pass the caller's flags here: open for both, so a file created to be read works too.
        return os.open(self._path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        if self._failing():
            raise FuseOSError(errno.EIO)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def opendir(self, path: str) -> int:
        return 0

    def releasedir(self, path: str, fh: int) -> None:
        return None

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        if self._failing():
            raise FuseOSError(errno.EIO)
        fd = os.open(self._path(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def main() -> None:
    backing, mount, control = sys.argv[1:4]
    # hard_remove: a file unlinked or renamed over while open goes at once, as on a disk (libfuse would otherwise
    # keep it as a hidden file, and a rename over it would not replace it atomically for a reader).
    FUSE(FailingFsync(os.path.abspath(backing), os.path.abspath(control)), mount, foreground=True, nothreads=True,
         hard_remove=True)


if __name__ == "__main__":
    main()
