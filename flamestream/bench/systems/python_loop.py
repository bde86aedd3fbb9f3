"""The plain-Python in-process loop: the computation as a dict loop, no framework.

Nothing crosses a process or a thread, nothing is durable: the physical limit
of one CPython core for this workload, measured by the same clock as the rest.
"""

from __future__ import annotations

import platform
from typing import Any

from flamestream.bench.harness import Pacer, RunSpec, Tracker
from flamestream.bench.workloads import PythonLoop as Loop
from flamestream.bench.workloads import Workload


class PythonLoop:
    guarantees = "none"
    check_method = "changelog"

    def setup(self, spec: RunSpec, workload: Workload) -> None:
        self._loop: Loop = workload.python_loop()

    def run(self, pacer: Pacer, tracker: Tracker) -> dict[str, Any]:
        process = self._loop.process
        for batch in pacer.batches():
            for _event_id, payload in batch:
                tracker.observe(process(payload))
        return {"version": f"CPython {platform.python_version()}"}

    def close(self) -> None:
        pass
