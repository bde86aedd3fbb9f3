"""A small tmpfs for a test: a disk that really fills up (the brief's "small tmpfs for a full disk")."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


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
        if mounted(mount):
            subprocess.run(["umount", "-l", str(mount)], check=False)
