"""Warm spares: node processes started ahead of need, so that a restart skips the interpreter's start-up.

Why: every recovery restarts every node of the tick (``flamestream.runtime.recovery``), and the slowest
start-up sets the pace.  Under load most of a node's start-up was Python importing gRPC, kazoo,
cryptography and the services (about 1 s of a 2–3 s recovery on a 2-core machine).  A spare has
imported all of that and waits on its standard input for the command line of the node it is to
become; the supervisor (``flamestream.runtime.restarts``) hands a node's restart to its spare and
starts the next spare once the cluster has been quiet for a while, so that a new spare's imports do not
compete with the nodes a recovery is starting.

A spare imports at the lowest CPU priority (nice 19): a cluster that never crashes pays for its spares
in idle time only.  It takes its original priority back as it becomes a node, so it does that only
where the process may raise its priority again (root, or an ``RLIMIT_NICE`` that allows it); elsewhere
it imports at its normal priority.  A spare whose supervisor is gone reads the end of its input and
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

LOWEST = 19
"""The niceness a spare imports at."""


@dataclass
class Spare:
    """A waiting spare, as the supervisor holds it."""

    process: subprocess.Popen[bytes]
    started: str | None
    """The kernel's start time of its process (``launcher.start_time``): the identity its node keeps."""

    @classmethod
    def start(cls, cwd: Path, env: dict[str, str]) -> Spare:
        # Imported here: the launcher pulls in gRPC, which a spare imports only once its priority is lowered.
        from flamestream.runtime.launcher import start_time

        process = subprocess.Popen([sys.executable, "-m", "flamestream.runtime.spares"], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env,
                                   start_new_session=True)
        return cls(process, start_time(process.pid))

    def alive(self) -> bool:
        return self.process.poll() is None

    def become(self, args: list[str], output: str, cwd: Path) -> bool:
        """Hand the spare ``python`` arguments ``args`` (``-m flamestream ...``), its output file and its
        working directory; False if it is gone (then it is no use: start the node cold)."""
        if not self.alive() or self.process.stdin is None:
            return False
        # At once, not when the spare reads its command: one still importing at nice 19 on a busy machine would
        # otherwise finish that at the lowest priority, slower than a new interpreter.  Allowed wherever the spare
        # lowered its priority itself (same user, same limits).
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, self.process.pid, os.getpriority(os.PRIO_PROCESS, 0))
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
    """Whether this process could go back to ``niceness`` after lowering its priority."""
    if os.geteuid() == 0:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= niceness


def main() -> int:
    """The spare itself: import at low priority, wait for the command line, become that node."""
    original = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = original < LOWEST and _may_raise_priority_to(original)
    if lowered:
        os.setpriority(os.PRIO_PROCESS, 0, LOWEST)
    from flamestream import cli  # what every node imports: the services, gRPC, kazoo, cryptography

    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # the supervisor is gone or did not need this spare
    command = json.loads(line)
    args: list[str] = command["args"]
    if args[:2] != ["-m", "flamestream"]:
        print(f"spare: not a flamestream command line: {args}", file=sys.stderr)
        return 2
    output = os.open(command["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(command["cwd"])
    if lowered:
        os.setpriority(os.PRIO_PROCESS, 0, original)
    sys.argv = [sys.executable, *args]
    return cli.main(args[2:])


if __name__ == "__main__":
    sys.exit(main())
