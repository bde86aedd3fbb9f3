"""Side-by-side benchmark suite (``flamestream bench``).

One invocation runs the same workload (:mod:`.workloads`) at the same seeded
Poisson rate on flamestream and on its peers (:mod:`.systems`), each in its
own process so CPU seconds and peak RSS are that system's alone
(:mod:`.harness`), checks every system's output against the sequential
oracle, and writes ``result.json`` plus a latency CDF (:mod:`.report`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXAMPLES_ROOT = Path(__file__).resolve().parents[2]
"""The source tree holding ``examples/``: the benchmark's workloads are the example graphs, which are files that
``deploy`` loads rather than an installed package, so the suite runs from a source checkout."""

if not (EXAMPLES_ROOT / "examples" / "wordcount.py").is_file():
    raise ImportError(f"flamestream bench needs the source tree's examples/ (looked in {EXAMPLES_ROOT}); run it "
                      "from a checkout installed with `pip install -e .`")
if str(EXAMPLES_ROOT) not in sys.path:
    sys.path.insert(0, str(EXAMPLES_ROOT))
    # Inherited by every process the suite starts (runners, Spark's Python workers), which import examples too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES_ROOT), os.environ.get("PYTHONPATH")]))
