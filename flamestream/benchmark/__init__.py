"""Side-by-side benchmark suite (``flamestream bench``).

One invocation runs the same workload (:mod:`.workloads`) at the same seeded
Poisson rate on flamestream and on its peers (:mod:`.systems`), each in its
own process so CPU seconds and peak RSS are that system's alone
(:mod:`.harness`), checks every system's output against the sequential
oracle, and writes ``result.json`` plus a latency CDF (:mod:`.report`).
"""
