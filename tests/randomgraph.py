"""Random graphs for property tests: stages of ints -> ints composed into one pipeline.

Every stage consumes and produces int payloads, so any sequence of stages is a
valid graph.  Stages cover every operation and both kinds of cycle: a reduce
loop (grouping(2) + combine + broadcast back) and a halving loop (a map cycle
that terminates).  Folds are order-sensitive so a wrong bucket order shows up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flamestream import Graph, Node

# -- business logic (module level: graphs reference functions by import path) -----


def inc(x: int) -> list[int]:
    return [(x + 1) % 1000]


def dup(x: int) -> list[int]:
    return [x, (x * 7 + 1) % 1000]


def drop_mult3(x: int) -> list[int]:
    return [] if x % 3 == 0 else [x]


def explode(x: int) -> list[int]:
    return [x % 1000, (x * 2) % 1000, (x * 3) % 1000] if x % 4 == 1 else [x]


def mod2(x: Any) -> int:
    return _first(x) % 2


def mod3(x: Any) -> int:
    return _first(x) % 3


def mod5(x: Any) -> int:
    return _first(x) % 5


def ident(x: Any) -> int:
    return _first(x)


def _first(x: Any) -> int:
    """Balancing for loop payloads ("m", v) / ("acc", key, total) as well as ints."""
    if isinstance(x, tuple):
        return int(x[1])
    return int(x)


def fold(window: tuple[int, ...]) -> list[int]:
    """Order-sensitive digest of a grouping window."""
    return [sum((i + 1) * (v + 3) for i, v in enumerate(window)) % 1000]


def to_mapped(x: int) -> list[tuple[str, int]]:
    return [("m", x)]


def key_of(x: tuple[Any, ...]) -> int:
    return int(x[1]) % 3 if x[0] == "m" else int(x[1])


def running_sum(window: tuple[Any, ...]) -> list[tuple[str, int, int]]:
    """Combine map of a reduce loop: per key, a running sum of the mapped values."""
    if len(window) == 1:
        (m,) = window
        return [("acc", m[1] % 3, m[1])] if m[0] == "m" else []
    acc, m = window
    if acc[0] == "acc" and m[0] == "m":
        return [("acc", acc[1], (acc[2] + m[1]) % 100_000)]
    return []


def total_of(acc: tuple[str, int, int]) -> list[int]:
    return [acc[2] % 1000]


def halve(x: int) -> list[int]:
    return [x // 2] if x > 1 else []


MAPS = {"inc": inc, "dup": dup, "drop_mult3": drop_mult3, "explode": explode}
BALANCES: dict[str, Any] = {"local": None, "mod2": mod2, "mod3": mod3, "mod5": mod5, "ident": ident}
GROUP_BALANCES = {k: v for k, v in BALANCES.items() if v is not None}


@dataclass(frozen=True)
class Stage:
    kind: str  # map | grouping | diamond | reduce | halving
    fn: str = "inc"
    other: str = "dup"
    balance: str = "local"
    window: int = 2


def build(stages: list[Stage]) -> Graph:
    g = Graph("random")
    tail: Node = g.source()
    for stage in stages:
        tail = _add(g, tail, stage)
    tail.to(g.sink())
    return g.validate()


def _add(g: Graph, tail: Node, s: Stage) -> Node:
    balance = BALANCES[s.balance]
    if s.kind == "map":
        return tail.to(g.map(MAPS[s.fn], balance=balance))
    if s.kind == "grouping":
        group_balance = BALANCES[s.balance] or mod2
        return tail.to(g.grouping(s.window, balance=group_balance)).to(g.map(fold, balance=mod3))
    if s.kind == "diamond":
        fork = tail.to(g.broadcast(2, balance=balance))
        join = g.merge(2)
        g.connect(fork.out(0), g.map(MAPS[s.fn])).to(join.inp(0))
        g.connect(fork.out(1), g.map(MAPS[s.other], balance=mod2)).to(join.inp(1))
        return join
    if s.kind == "reduce":
        loop = g.merge(2)
        tail.to(g.map(to_mapped, balance=balance)).to(loop.inp(0))
        fanout = loop.to(g.grouping(2, balance=key_of)).to(g.map(running_sum)).to(g.broadcast(2))
        g.connect(fanout.out(1), loop.inp(1))
        return g.connect(fanout.out(0), g.map(total_of, balance=mod5))
    assert s.kind == "halving"
    loop = g.merge(2, balance=balance)
    tail.to(loop.inp(0))
    fanout = loop.to(g.map(halve, balance=ident)).to(g.broadcast(2))
    g.connect(fanout.out(1), loop.inp(1))
    return g.connect(fanout.out(0), g.map(inc))


def halve_window(window: tuple[int, ...]) -> list[int]:
    """Loop body over a grouping's window: halve its last value until it reaches 1."""
    return halve(window[-1])
