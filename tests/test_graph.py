"""Graph builder (paper §2.2, §2.5, §2.7): validation messages, function references, JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flamestream.core.graph import Edge, Graph, GraphError, Operation, changed_groupings, dropped_groupings
from tests import graphfns as fns


def wordcount() -> Graph:
    """The paper's MapReduce graph (Figure 5): map, merge, grouping(2), combine, broadcast back."""
    g = Graph("wordcount")
    src = g.source()
    split = g.map(fns.split_words, name="split")
    loop = g.merge(2, balance=fns.word_hash, name="loop")
    group = g.grouping(2, balance=fns.word_hash, equivalence=fns.word_key, name="group")
    comb = g.map(fns.combine, name="combine")
    fork = g.broadcast(2, name="fork")
    sink = g.sink()
    src.to(split).to(loop.inp(0))
    loop.to(group).to(comb).to(fork)
    g.connect(fork.out(0), sink)
    g.connect(fork.out(1), loop.inp(1))
    return g


def linear(*middle: str) -> dict[str, Any]:
    """Plain-data graph: source -> identity maps named ``middle`` -> sink, for malformed-data tests."""
    g = Graph("lin")
    node = g.source()
    for name in middle:
        node = node.to(g.map(fns.identity, name=name))
    node.to(g.sink())
    return g.to_dict()


def faults_of(g: Graph) -> str:
    with pytest.raises(GraphError) as info:
        g.validate()
    return str(info.value)


# -- a sound graph ------------------------------------------------------------------


def test_wordcount_graph_validates_and_serialises() -> None:
    g = wordcount()
    assert g.validate() is g
    d = g.to_dict()
    assert d["name"] == "wordcount"
    assert [op["name"] for op in d["operations"]] == ["source", "split", "loop", "group", "combine", "fork", "sink"]
    assert d["operations"][3] == {
        "name": "group",
        "kind": "grouping",
        "inputs": 1,
        "outputs": 1,
        "balance": "tests.graphfns:word_hash",
        "window": 2,
        "equivalence": "tests.graphfns:word_key",
    }
    assert d["operations"][1]["fn"] == "tests.graphfns:split_words"
    assert d["edges"] == [
        ["source", 0, "split", 0],
        ["split", 0, "loop", 0],
        ["loop", 0, "group", 0],
        ["group", 0, "combine", 0],
        ["combine", 0, "fork", 0],
        ["fork", 0, "sink", 0],
        ["fork", 1, "loop", 1],
    ]


def test_json_round_trip() -> None:
    g = wordcount()
    text = g.to_json()
    back = Graph.from_json(text)
    assert back == g
    assert back.to_json() == text
    assert back.operations["group"] == Operation(
        "group", "grouping", 1, 1, balance="tests.graphfns:word_hash", window=2, equivalence="tests.graphfns:word_key"
    )
    assert back.edges[-1] == Edge("fork", 1, "loop", 1)


def test_round_trip_keeps_sys_path() -> None:
    g = wordcount()
    g.sys_path.append("/nonexistent/flamestream-test-path")
    back = Graph.from_json(g.to_json())
    assert back.sys_path == ["/nonexistent/flamestream-test-path"]
    assert back.to_json() == g.to_json()


def test_functions_given_as_paths() -> None:
    g = Graph()
    g.source().to(g.map("tests.graphfns:identity", balance="flamestream.core.hashing:stable_hash")).to(g.sink())
    assert g.to_dict()["operations"][1] == {
        "name": "map0",
        "kind": "map",
        "inputs": 1,
        "outputs": 1,
        "fn": "tests.graphfns:identity",
        "balance": "flamestream.core.hashing:stable_hash",
    }


def test_static_method_has_a_path() -> None:
    g = Graph()
    g.source().to(g.map(fns.Namespace.nested)).to(g.sink())
    assert g.to_dict()["operations"][1]["fn"] == "tests.graphfns:Namespace.nested"


def test_default_names_count_per_kind() -> None:
    g = Graph()
    s = g.source()
    a, b = g.map(fns.identity), g.map(fns.identity)
    s.to(a).to(b).to(g.sink())
    assert list(g.validate().operations) == ["source", "map0", "map1", "sink"]


# -- validation messages --------------------------------------------------------------


def test_dangling_ports() -> None:
    g = Graph("d")
    s = g.source()
    m = g.map(fns.identity)
    g.sink()
    s.to(m)
    msg = faults_of(g)
    assert "invalid graph 'd'" in msg
    assert "dangling port: output 0 of map 'map0' is not connected" in msg
    assert "dangling port: input 0 of sink 'sink' is not connected" in msg
    assert "unreachable sink: sink 'sink' cannot be reached from the source" in msg


def test_dangling_broadcast_output() -> None:
    g = Graph()
    b = g.broadcast(3)
    g.source().to(b).to(g.sink())
    g.connect(b.out(2), g.sink("other"))
    msg = faults_of(g)
    assert "dangling port: output 1 of broadcast 'broadcast0' is not connected" in msg
    assert "output 0" not in msg and "output 2" not in msg


def test_missing_hash() -> None:
    g = Graph()
    g.source().to(g.grouping(2, name="grp")).to(g.sink())
    assert "grouping 'grp': missing hash" in faults_of(g)


@pytest.mark.parametrize("window", [0, -1, 2.5, "3", None])
def test_bad_window(window: Any) -> None:
    g = Graph()
    g.source().to(g.grouping(window, balance=fns.word_hash, name="grp")).to(g.sink())
    assert f"grouping 'grp': window must be an integer >= 1, got {window!r}" in faults_of(g)


def test_unreachable_sink_in_a_detached_cycle() -> None:
    """No dangling port anywhere: a merge/broadcast loop feeds a sink but nothing feeds the loop."""
    g = Graph()
    g.source().to(g.sink("main"))
    loop = g.merge(1, name="loop")
    fork = g.broadcast(2, name="fork")
    loop.to(fork)
    g.connect(fork.out(0), loop.inp(0))
    g.connect(fork.out(1), g.sink("lost"))
    msg = faults_of(g)
    assert "dangling" not in msg
    assert "unreachable sink: sink 'lost' cannot be reached from the source" in msg
    assert "unreachable operation: merge 'loop' cannot be reached from the source" in msg
    assert "unreachable operation: broadcast 'fork' cannot be reached from the source" in msg
    assert "'main'" not in msg


def test_output_connected_twice() -> None:
    g = Graph()
    s = g.source()
    s.to(g.sink("a"))
    s.to(g.sink("b"))
    assert "output 0 of source 'source' is connected 2 times; use a broadcast" in faults_of(g)


def test_input_with_two_edges() -> None:
    g = Graph()
    b = g.broadcast(2)
    k = g.sink()
    g.source().to(b)
    g.connect(b.out(0), k)
    g.connect(b.out(1), k)
    assert "input 0 of sink 'sink' is connected 2 times; use a merge" in faults_of(g)


def test_lambda_rejected() -> None:
    g = Graph()
    g.source().to(g.map(lambda x: [x], name="m")).to(g.sink())
    msg = faults_of(g)
    assert "has no import path; define it as a module-level function" in msg
    assert "map 'm': missing function" in msg


def test_map_function_fault_names_the_operation() -> None:
    """BUG (minor): Graph.map passes the literal "map" as the fault location, so a bad function of map 'm'
    is reported as "map: ..." without the operation name (broadcast/merge/grouping do name it)."""
    g = Graph()
    g.source().to(g.map(fns.identity, balance="tests.graphfns:nope", name="m")).to(g.sink())
    assert "map 'm'" in faults_of(g) or "m: module" in faults_of(g)


def test_nested_function_rejected() -> None:
    def local(x: Any) -> list[Any]:
        return [x]

    g = Graph()
    g.source().to(g.map(fns.identity, balance=local, name="m")).to(g.sink())
    assert "no import path" in faults_of(g)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("tests.graphfns:nope", "module 'tests.graphfns' has no attribute 'nope'"),
        ("tests.graphfns", "must look like 'package.module:function'"),
        (":identity", "must look like 'package.module:function'"),
        ("tests.graphfns:NOT_CALLABLE", "'tests.graphfns:NOT_CALLABLE' is not callable"),
    ],
)
def test_bad_import_path(path: str, message: str) -> None:
    g = Graph()
    g.source().to(g.map(path, name="m")).to(g.sink())
    assert message in faults_of(g)


def test_every_fault_reported_at_once() -> None:
    g = Graph()
    s = g.source()
    s.to(g.grouping(0, name="grp")).to(g.map(lambda x: x, name="m"))
    g.sink()
    msg = faults_of(g)
    for expected in (
        "window must be an integer >= 1",
        "missing hash",
        "no import path",
        "dangling port: output 0 of map 'm'",
        "dangling port: input 0 of sink 'sink'",
        "unreachable sink",
    ):
        assert expected in msg


def test_source_and_sink_counts() -> None:
    g = Graph()
    g.map(fns.identity)
    msg = faults_of(g)
    assert "a graph needs exactly one source, found 0" in msg
    assert "a graph needs at least one sink" in msg
    g = Graph()
    g.source().to(g.sink())
    g.source("second").to(g.sink("k2"))
    assert "a graph needs exactly one source, found 2" in faults_of(g)


def test_duplicate_name_and_bad_edges() -> None:
    g = Graph()
    s = g.source()
    s.to(g.sink("x"))
    g.sink("x")
    g.connect(s.out(3), g.sink("y"))
    msg = faults_of(g)
    assert "operation name 'x' is used twice" in msg
    assert "edge source[3] -> y[0]: source 'source' has no output 3" in msg
    g = Graph()
    g.edges.append(Edge("source", 0, "ghost", 0))
    g.source()
    g.sink()
    assert "edge source[0] -> ghost[0]: unknown operation 'ghost'" in faults_of(g)


def test_broadcast_and_merge_need_ports() -> None:
    g = Graph()
    g.broadcast(0, name="b")
    g.merge(0, name="m")
    msg = faults_of(g)
    assert "broadcast 'b': needs at least 1 output, got 0" in msg
    assert "merge 'm': needs at least 1 input, got 0" in msg


def test_to_json_validates() -> None:
    g = Graph()
    g.source()
    with pytest.raises(GraphError, match="at least one sink"):
        g.to_json()


# -- from_json rejects malformed data ------------------------------------------------


def mutated(mutate: Any) -> str:
    data = linear("a")
    mutate(data)
    return json.dumps(data)


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def apply(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


MALFORMED = {
    "not json": "{not json",
    "array": "[1, 2]",
    "string": '"graph"',
    "no operations": json.dumps({"name": "g", "edges": []}),
    "no edges": mutated(lambda d: d.pop("edges")),
    "operations not a list": mutated(_set(("operations",), 5)),
    "operation not an object": mutated(_set(("operations", 1), "map")),
    "unknown field": mutated(_set(("operations", 1, "colour"), "red")),
    "missing field": mutated(lambda d: d["operations"][1].pop("kind")),
    "short edge": mutated(_set(("edges", 0), ["source", 0, "a"])),
    "edge port not a number": mutated(_set(("edges", 0), ["source", "zero", "a", 0])),
    "edges not a list": mutated(_set(("edges",), 3)),
    "unknown kind": mutated(_set(("operations", 1, "kind"), "teleport")),
    "bad function path": mutated(_set(("operations", 1, "fn"), "tests.graphfns:nope")),
    "map without function": mutated(lambda d: d["operations"][1].pop("fn")),
    "edge to unknown operation": mutated(_set(("edges", 1), ["a", 0, "ghost", 0])),
    "duplicate operation": mutated(lambda d: d["operations"].append(dict(d["operations"][1]))),
}


@pytest.mark.parametrize("text", list(MALFORMED.values()), ids=list(MALFORMED))
def test_from_json_rejects_malformed(text: str) -> None:
    with pytest.raises(GraphError):
        Graph.from_json(text)


def test_from_json_error_messages() -> None:
    with pytest.raises(GraphError, match="not valid JSON"):
        Graph.from_json("{")
    with pytest.raises(GraphError, match="must be an object"):
        Graph.from_json("[]")
    with pytest.raises(GraphError, match="malformed graph data"):
        Graph.from_json(MALFORMED["unknown field"])
    with pytest.raises(GraphError, match="unknown kind 'teleport'"):
        Graph.from_json(MALFORMED["unknown kind"])


def grouping_dict(**fields: Any) -> dict[str, Any]:
    data = linear("a")
    op = {"name": "grp", "kind": "grouping", "inputs": 1, "outputs": 1, **fields}
    data["operations"].insert(2, op)
    data["edges"] = [["source", 0, "a", 0], ["a", 0, "grp", 0], ["grp", 0, "sink", 0]]
    return data


def test_from_json_accepts_sound_grouping() -> None:
    data = grouping_dict(window=2, balance="tests.graphfns:word_hash")
    g = Graph.from_json(json.dumps(data))
    assert g.operations["grp"].window == 2


# The builder checks these, but data shipped as JSON skips the builder.


def test_from_json_rejects_non_integer_port_count() -> None:
    """BUG: validate() compares the port count with ints and leaks TypeError instead of GraphError."""
    data = linear("a")
    data["operations"][1]["inputs"] = "1"
    with pytest.raises(GraphError):
        Graph.from_json(json.dumps(data))


@pytest.mark.parametrize("window", [0, -2, "2", None])
def test_from_json_rejects_bad_grouping_window(window: Any) -> None:
    """BUG: the window check lives only in Graph.grouping(); from_dict accepts any window."""
    data = grouping_dict(window=window, balance="tests.graphfns:word_hash")
    if window is None:
        del data["operations"][2]["window"]
    with pytest.raises(GraphError, match="window must be an integer >= 1"):
        Graph.from_json(json.dumps(data))


def test_from_json_rejects_grouping_without_hash() -> None:
    """BUG: 'missing hash' is checked only in Graph.grouping(); a shipped grouping without a balancing
    function is accepted (workers would then group locally, splitting a key's bucket across workers)."""
    data = grouping_dict(window=2)
    with pytest.raises(GraphError, match="missing hash"):
        Graph.from_json(json.dumps(data))


def test_unnamed_sinks_get_names_of_their_own() -> None:
    g = Graph("two_sinks")
    split = g.source().to(g.broadcast(2, name="split"))
    g.connect(split.out(0), g.sink())
    g.connect(split.out(1), g.sink())
    assert [op.name for op in g.validate().operations.values() if op.kind == "sink"] == ["sink", "sink1"]


def test_state_is_matched_by_grouping_name_and_its_changes_are_named() -> None:
    from examples import inverted_index, wordcount

    count, index = wordcount.graph().to_dict(), inverted_index.graph().to_dict()
    keys = ("balance", "equivalence", "window")
    assert dropped_groupings(index, count) == ["revisions"] and dropped_groupings(count, index) == []
    assert changed_groupings(count, count, keys) == []
    (by_word,) = changed_groupings(count, index, keys)
    assert by_word.startswith("'by_word' (balance 'examples.wordcount:word_hash' -> "
                              "'examples.inverted_index:word_hash'")
    assert "equivalence 'examples.wordcount:word_of' -> 'examples.inverted_index:word_of'" in by_word
    assert changed_groupings(count, index, ("window",)) == []
    wider = json.loads(json.dumps(count))
    next(op for op in wider["operations"] if op["name"] == "by_word")["window"] = 3
    assert changed_groupings(count, wider, keys) == ["'by_word' (window 2 -> 3)"]
    renamed_map = json.loads(json.dumps(count))  # a function downstream of the grouping may change freely
    next(op for op in renamed_map["operations"] if op["name"] == "combine")["fn"] = "examples.wordcount:other"
    assert renamed_map != count
    assert changed_groupings(count, renamed_map, keys) == [] and dropped_groupings(count, renamed_map) == []
