"""The sequential oracle: the definition of a graph's correct output.

It takes the stamped inputs in global-time order and pushes each one through
the graph depth-first, to completion, before the next.  Depth-first order *is*
meta order (an image follows its preimage and precedes the next item, §2.4),
so every item reaches a grouping after everything that sorts before it: the
grouping is just an append-only bucket holding the last ``window`` payloads.
No traces, no replay, no acker, no barrier — nothing to get subtly wrong.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from flamestream.core.dead_letter import dead_letter
from flamestream.core.front import Stamped
from flamestream.core.graph import Graph
from flamestream.core.hashing import as_hash
from flamestream.core.limits import bounded_outputs
from flamestream.core.meta import GlobalTime
from flamestream.core.plan import BROADCAST, GROUPING, MAP, MERGE, SINK, Plan, compile_graph
from flamestream.core.worker import entry_hash

Output = list[tuple[GlobalTime, Any]]
Buckets = dict[tuple[int, Hashable], deque[Any]]


def run_oracle(graph: Graph, stamped: list[Stamped]) -> tuple[Output, list[Any]]:
    """Return (released (global time, payload) in order, payloads rejected at the front)."""
    output, rejected, _ = _run(compile_graph(graph), stamped)
    return output, rejected


def oracle_state(graph: Graph, stamped: list[Stamped], below: GlobalTime) -> dict[tuple[str, Hashable], list[Any]]:
    """Grouping state after the inputs before ``below``, trimmed as workers trim it: by (grouping name, key),
    the last ``window - 1`` payloads.  What a snapshot at ``below`` must hold."""
    plan = compile_graph(graph)
    _, _, buckets = _run(plan, [s for s in stamped if s[1] < below])
    state: dict[tuple[str, Hashable], list[Any]] = {}
    for (op, key), bucket in buckets.items():
        kept = list(bucket)[1:] if len(bucket) == plan.windows[op] else list(bucket)
        if kept:
            state[(plan.names[op], key)] = kept
    return state


def _run(plan: Plan, stamped: list[Stamped]) -> tuple[Output, list[Any], Buckets]:
    buckets: Buckets = {}
    output: Output = []
    rejected: list[Any] = []
    for _front, gt, _trace, payload in sorted(stamped, key=lambda s: (s[1], s[2])):
        if entry_hash(plan, payload) is None:
            rejected.append(payload)
            continue
        stack: list[tuple[int, Any]] = [(plan.entry, payload)]
        while stack:
            op, p = stack.pop()
            kind = plan.kinds[op]
            if kind == SINK:
                output.append((gt, p))
                continue
            try:
                balance = plan.balances[op]
                h = as_hash(balance(p)) if balance is not None else None  # folded or failed, as on a worker
                dst = plan.routes[op][0] if plan.routes[op] else -1
                if kind == MAP:
                    fn: Any = plan.fns[op]
                    outs = [(dst, q) for q in bounded_outputs(fn(p), plan.max_outputs, plan.max_output_bytes)]
                elif kind == BROADCAST:
                    outs = [(d, p) for d in plan.routes[op]]
                elif kind == MERGE:
                    outs = [(dst, p)]
                else:
                    assert kind == GROUPING
                    eq = plan.equivalences[op]
                    key = (op, h if eq is None else (h, eq(p)))
                    bucket = buckets.setdefault(key, deque(maxlen=plan.windows[op]))
                    bucket.append(p)
                    outs = [(dst, tuple(bucket))]
            except Exception as exc:
                output.append((gt, dead_letter(plan.names[op], exc, p)))
                continue
            stack.extend(reversed(outs))
    return output, rejected, buckets
