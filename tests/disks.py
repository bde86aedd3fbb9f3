"""Disks that really fail, for a test: a small tmpfs that fills up (the brief's "small tmpfs for a full disk"), and
a FUSE mount whose fsync fails on demand (``tests/faultfs.py``)."""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def _unmount(path: Path) -> None:
    """Detach whatever is mounted at ``path`` (lazily: a process may still hold a file there); nothing if nothing."""
    if mounted(path):
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``mount`` (created) for the block; skips the test without root or a mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr}")
    try:
        yield mount
    finally:
        _unmount(mount)


@dataclass(frozen=True)
class FailingFsync:
    """A mounted ``tests/faultfs.py``: fsync on it fails with EIO between ``fail`` and ``heal``."""

    mount: Path
    control: Path

    def fail(self) -> None:
        self.control.touch()

    def heal(self) -> None:
        self.control.unlink(missing_ok=True)


MOUNT_WAIT = 20.0
"""Seconds a FUSE mount may take to appear in /proc/mounts."""


@contextlib.contextmanager
def failing_fsync(mount: Path, work: Path) -> Iterator[FailingFsync]:
    """``tests/faultfs.py`` mounted at ``mount`` (created) for the block, its files, its control file and its
    output in ``work``; skips the test without root, /dev/fuse, fusepy or libfuse 2 (``scripts/install dev``
    brings both), and fails it if the file system itself does not mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a FUSE file system needs root")
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse")
    if importlib.util.find_spec("fuse") is None or ctypes.util.find_library("fuse") is None:
        pytest.skip("no fusepy or no libfuse 2 (`bash scripts/install dev` installs them)")
    backing, control, output = work / "faultfs-files", work / "faultfs-failing", work / "faultfs.out"
    for directory in (mount, backing):
        directory.mkdir(parents=True)
    repo = Path(__file__).resolve().parent.parent
    with output.open("wb") as out:  # a file, not a pipe nobody reads: a full pipe would block the file system
        server = subprocess.Popen([sys.executable, "-m", "tests.faultfs", str(backing), str(mount), str(control)],
                                  cwd=repo, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + MOUNT_WAIT
        while not mounted(mount):
            assert server.poll() is None, f"tests/faultfs.py exited with {server.returncode}: {output.read_text()}"
            assert time.monotonic() < deadline, f"{mount} was not mounted within {MOUNT_WAIT} s"
            time.sleep(0.05)
        yield FailingFsync(mount, control)
    finally:
        control.unlink(missing_ok=True)
        _unmount(mount)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        _unmount(mount)  # a server killed, or mounted after the wait gave up: its mount is dead, take it away
