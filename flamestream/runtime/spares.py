"""Warm spares: node processes started ahead of need, so that a restart skips the interpreter's start-up.

Why: every recovery restarts every node of the tick (``flamestream.runtime.recovery``), and the slowest
start-up sets the pace.  Under load most of a node's start-up was Python importing gRPC, kazoo,
cryptography and the services (about 1 s of a 2–3 s recovery on a 2-core machine).  A spare has
imported all of that and waits on its standard input for the command line of the node it is to
become; the supervisor (``flamestream.runtime.restarts``) hands a node's restart to its spare and
starts the next spare once the cluster has been quiet for a while, so that a new spare's imports do not
compete with the nodes a recovery is starting.

The process is ``flamestream spare`` (the command line's own entry, which imports every service) and
``receive`` is its side of the hand-over.  The supervisor lowers a new spare to the lowest CPU priority
(nice 19), so a cluster that never crashes pays for its spares in idle time only, and gives the
priority back as it hands a node over; it lowers it only where it may raise it again (root, or an
``RLIMIT_NICE`` that allows it).  A spare whose supervisor is gone reads the end of its input and
exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flamestream.runtime.launcher import child_env, node_name, start_time

LOWEST = 19
"""The niceness a spare imports at."""


@dataclass
class Spare:
    """A waiting spare, as the supervisor holds it."""

    process: subprocess.Popen[bytes]
    started: str | None
    """The kernel's start time of its process (``launcher.start_time``): the identity its node keeps."""
    priority: int | None
    """The niceness to give back when it becomes a node; None if it was not lowered."""

    @classmethod
    def start(cls, cwd: Path) -> Spare:
        """A new spare in ``cwd``, with the environment every node gets (``launcher.child_env``)."""
        # ``--data-dir`` only names the cluster on the command line, for ``ps`` and ``pgrep -f DIR``: a spare
        # that became a node keeps the command line it was started with.
        process = subprocess.Popen([sys.executable, "-m", "flamestream", "spare", "--data-dir", str(cwd)],
                                   stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=child_env(),
                                   start_new_session=True)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        priority: int | None = None
        if own < LOWEST and _may_raise_priority_to(own):
            with contextlib.suppress(OSError):  # gone already: ``become`` finds out
                os.setpriority(os.PRIO_PROCESS, process.pid, LOWEST)
                priority = own
        return cls(process, start_time(process.pid), priority)

    def alive(self) -> bool:
        return self.process.poll() is None

    def become(self, args: list[str], output: str, cwd: Path) -> bool:
        """Hand the spare ``python`` arguments ``args`` (``-m flamestream ...``), its output file and its
        working directory; False if it is gone (then it is no use: start the node cold)."""
        if not self.alive() or self.process.stdin is None:
            return False
        if self.priority is not None:  # at once: one still importing at nice 19 on a busy machine would be slow
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.process.pid, self.priority)
        try:
            self.process.stdin.write(json.dumps({"args": args, "output": output, "cwd": str(cwd)}).encode() + b"\n")
            self.process.stdin.close()
        except OSError:  # it died just now
            return False
        return True

    def stop(self) -> None:
        """End a spare that will not be used (its input closes: it exits by itself)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        if self.alive():
            self.process.kill()
        self.process.wait()


def _may_raise_priority_to(niceness: int) -> bool:
    """Whether this process could give a process of its own back ``niceness`` after lowering its priority."""
    if os.geteuid() == 0:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= niceness


def receive() -> list[str] | None:
    """The spare's side: wait for the command line, take the node's output file and working directory, and
    return the arguments of ``flamestream`` it is to run; None if the supervisor sent nothing (it is gone)."""
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    command = json.loads(line)
    args: list[str] = command["args"]
    if args[:2] != ["-m", "flamestream"]:
        raise SystemExit(f"spare: not a flamestream command line: {args}")
    output = os.open(command["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(command["cwd"])
    sys.argv = [sys.executable, *args]
    name = node_name(args)
    if name is not None:
        _name_process(f"fs {name}")
    return args[2:]


def _name_process(name: str) -> None:
    """Show ``name`` as the process's name (``ps``, ``top``, ``pgrep NAME``; the kernel keeps 15 bytes): its
    command line still says ``spare``."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])
