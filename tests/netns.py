"""Two "hosts" for multi-host tests: a pair of network namespaces joined by a veth pair (root and iproute2 needed).

Traffic stays inside the namespaces the test creates; nothing is sent to any
other non-loopback address.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _delete(names: tuple[str, ...]) -> None:
    """Delete namespaces ``names`` where they exist; deleting one deletes its end of a veth pair, and so the pair."""
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@contextlib.contextmanager
def veth_pair(names: tuple[str, str], devices: tuple[str, str], addresses: tuple[str, str]) -> Iterator[None]:
    """Namespaces ``names``, device ``devices[i]`` with ``addresses[i]``/24 in ``names[i]``; deleted on exit.
    Skips the test where namespaces cannot be made."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 (`ip netns`)")
    try:
        _delete(names)  # left over from an interrupted run
        for ns in names:
            ip("netns", "add", ns)
        ip("link", "add", devices[0], "type", "veth", "peer", "name", devices[1])
        for ns, dev, addr in zip(names, devices, addresses, strict=True):
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        _delete(names)
        pytest.skip(f"cannot create network namespaces: {exc.stderr.decode(errors='replace').strip()}")
    try:
        yield
    finally:
        _delete(names)
