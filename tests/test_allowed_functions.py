"""Issue #12: no code execution from data — graph functions resolve only from allowed modules.

A graph names its functions by import path, and a tick is data anyone with ZooKeeper access can write: without a
policy ``map("os:system")`` runs every payload as a shell command on the workers (and an entry balance on the
fronts).  Functions must come from the graph's own package, ``flamestream.core.hashing`` or an explicit
``--allow-module``; these tests check the policy itself, the refusal at ``run``/``deploy`` (clear message, non-zero
exit, nothing published) and that a node given such a tick straight through ZooKeeper runs nothing.
"""

from __future__ import annotations

import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flamestream.client import Client, ClientError
from flamestream.cluster import ACKER, BARRIER, FRONT, WORKER, ClusterStore
from flamestream.core.functions import (
    Allowed,
    FunctionNotAllowed,
    FunctionRefError,
    module_location,
    process_policy,
    resolve,
    set_process_policy,
)
from flamestream.core.graph import Graph
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick
from flamestream.loader import load_graph
from flamestream.runtime import launcher
from tests import graphfns as fns
from tests.test_cluster_e2e import cli, running

# -- a user package to reach the standard library from -------------------------------------------------------------


@pytest.fixture
def userpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable package ``<name>`` with ``<name>.fns`` re-exporting os, os.system and eval, and an
    ``<name>.loud`` module that leaves a marker when imported (to see that refusing never imports)."""
    name = f"userpkg_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fns.py").write_text(textwrap.dedent("""\
        import functools
        import os
        from builtins import eval as ev
        from os import system

        shell = functools.partial(os.system)

        def ok(payload):
            return [payload]

        class Holder:
            run = staticmethod(os.system)

            @staticmethod
            def fine(payload):
                return [payload]
        """))
    (package / "loud.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\ndef f(x): return [x]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield name
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def own(module: str) -> Allowed:
    """The default policy for a graph defined in ``module``."""
    return Allowed().for_graph(module, module_location(module))


# -- the policy --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["os:system", "builtins:eval", "subprocess:run", "importlib:import_module",
                                  "flamestream.cli:main", "flamestream.loader:import_graph_module"])
def test_dangerous_functions_are_refused_by_default(path: str) -> None:
    with pytest.raises(FunctionNotAllowed) as info:
        resolve(path, own("examples.wordcount"))
    message = str(info.value)
    assert repr(path) in message and "--allow-module" in message


def test_refusal_names_the_reference_and_the_flag() -> None:
    with pytest.raises(FunctionNotAllowed, match=r"'os:system' is not allowed: module 'os' is not an allowed "
                                                 r"module; allowed: the graph's own package 'examples'.*"
                                                 r"pass --allow-module os"):
        resolve("os:system", own("examples.wordcount"))


def test_allowed_example_functions_resolve() -> None:
    from examples import wordcount

    assert resolve("examples.wordcount:split_words", own("examples.wordcount")) is wordcount.split_words
    assert resolve("flamestream.core.hashing:stable_hash", Allowed()) is not None
    assert resolve("tests.graphfns:Namespace.nested", own(__name__)) is fns.Namespace.nested


def test_a_refused_module_is_not_even_imported(userpkg: str, tmp_path: Path) -> None:
    with pytest.raises(FunctionNotAllowed):
        resolve(f"{userpkg}.loud:f", own("examples.wordcount"))
    assert not (tmp_path / "imported").exists()
    assert f"{userpkg}.loud" not in sys.modules


@pytest.mark.parametrize(("attribute", "reason"), [
    ("os.system", "leaves module '{pkg}.fns' for module 'os'"),  # import os; walk into it
    ("system", "defined in module 'posix'"),                     # from os import system
    ("ev", "defined in module 'builtins'"),                      # from builtins import eval
    ("shell", "defined in module 'functools'"),                  # a partial around os.system
    ("Holder.run", "defined in module 'posix'"),                 # a class attribute that is os.system
    ("__builtins__", "goes through '__builtins__'"),
    ("ok.__globals__", "goes through '__globals__'"),
])
def test_attribute_walks_out_of_an_allowed_module_are_refused(userpkg: str, attribute: str, reason: str) -> None:
    policy = own(f"{userpkg}.graph")
    with pytest.raises(FunctionNotAllowed, match=reason.format(pkg=userpkg)):
        resolve(f"{userpkg}.fns:{attribute}", policy)


def test_the_user_packages_own_functions_resolve(userpkg: str) -> None:
    policy = own(f"{userpkg}.graph")
    assert resolve(f"{userpkg}.fns:ok", policy)("x") == ["x"]
    assert resolve(f"{userpkg}.fns:Holder.fine", policy)("x") == ["x"]


def test_allow_module_is_a_prefix_of_dotted_names() -> None:
    policy = Allowed.of(["mylib", "other.helpers"])
    assert policy.permits("mylib") and policy.permits("mylib.sub.deep")
    assert not policy.permits("mylibx") and not policy.permits("my")
    assert policy.permits("other.helpers.x") and not policy.permits("other") and not policy.permits("other.help")
    assert Allowed().permits("flamestream.core.hashing") and not Allowed().permits("flamestream")
    assert not Allowed().permits("flamestream.cli") and not Allowed().permits("flamestream.core.graph")


def test_standard_library_only_when_listed_exactly() -> None:
    policy = Allowed.of(["os", "xml", "json"])
    assert policy.permits("os") and policy.permits("json")
    assert not policy.permits("os.path") and not policy.permits("xml.etree.ElementTree")
    assert not policy.permits("posix") and not policy.permits("builtins")
    assert resolve("json:loads", policy)('["a"]') == ["a"]
    with pytest.raises(FunctionNotAllowed, match=r"defined in module 'posix'.*--allow-module posix"):
        resolve("os:system", policy)  # os.system is posix.system: that module must be listed too


@pytest.mark.parametrize("module", ["os", "builtins", "subprocess.x", "json.tool", "__main__"])
def test_the_standard_library_is_never_the_graphs_own(module: str) -> None:
    policy = own(module)
    assert policy.own is None
    assert not policy.permits(module)


def test_an_installed_package_is_never_the_graphs_own() -> None:
    """psutil is a dependency of every node and ``psutil:Popen`` runs commands."""
    policy = own("psutil")
    assert policy.own is None and "installed package" in policy.own_refused
    with pytest.raises(FunctionNotAllowed, match=r"'psutil:Popen' is not allowed.*installed package"):
        resolve("psutil:Popen", policy)


def test_own_package_is_the_parent_of_the_graph_module() -> None:
    assert own("examples.wordcount").own == "examples"
    assert own("mygraph_nowhere").own == "mygraph_nowhere"  # a top-level graph file is its own package
    assert own("a.b.c").own == "a.b"
    assert own("not a module").own is None


@pytest.mark.parametrize("name", ["", "a b", "a..b", ".a", "a.", "1a", "a/b"])
def test_allow_module_rejects_what_is_not_a_module_name(name: str) -> None:
    with pytest.raises(FunctionRefError, match="is not a module name"):
        Allowed.of([name])


# -- graphs ------------------------------------------------------------------------------------------------------


def shell_graph(module: str | None = None) -> dict[str, Any]:
    """A graph whose map and entry balance are ``os:system`` (the builder allows it: it is the author's process)."""
    g = Graph("shell")
    g.source().to(g.map("os:system", balance="os:system", name="run")).to(g.sink())
    data = g.to_dict()
    if module is not None:
        data["module"] = module
    return data


def test_a_graph_records_the_module_that_defined_it() -> None:
    g = Graph("here")
    g.source().to(g.map(fns.identity)).to(g.sink())
    assert g.module == __name__
    assert g.to_dict()["module"] == __name__
    assert Graph.from_dict(g.to_dict()).module == __name__  # and the tests package is its own


@pytest.mark.parametrize("module", [None, __name__, "os", "psutil"])
def test_from_dict_refuses_a_shipped_shell_graph(module: str | None) -> None:
    with pytest.raises(FunctionNotAllowed) as info:
        Graph.from_dict(shell_graph(module))
    message = str(info.value)
    assert "map 'run': function 'os:system' is not allowed" in message  # both references, named by operation
    assert message.count("'os:system' is not allowed") == 2


def test_from_dict_uses_the_process_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node sets its --allow-module as the process policy; services rebuild graphs without passing one."""
    g = Graph("sqrt")
    g.source().to(g.map("math:sqrt")).to(g.sink())
    with pytest.raises(FunctionNotAllowed, match="--allow-module math"):
        Graph.from_dict(g.to_dict())
    monkeypatch.setattr("flamestream.core.functions._POLICY", process_policy())
    set_process_policy(Allowed.of(["math"]))
    assert Graph.from_dict(g.to_dict()).operations["map0"].fn == "math:sqrt"
    with pytest.raises(FunctionNotAllowed):
        Graph.from_dict(g.to_dict(), Allowed())  # an explicit policy wins


def test_a_duplicate_operation_cannot_hide_a_refused_function() -> None:
    data = shell_graph()
    benign = {"name": "run", "kind": "map", "inputs": 1, "outputs": 1, "fn": "tests.graphfns:identity"}
    data["operations"].append(benign)
    with pytest.raises(FunctionNotAllowed):
        Graph.from_dict(data)


def write_graph(directory: Path, body: str) -> Path:
    """A graph file ``directory/<unique>.py`` (a top-level module, as a user's graph file outside any package)."""
    path = directory / f"graph_{uuid.uuid4().hex[:8]}.py"
    path.write_text("from flamestream import Graph\n\n\ndef graph():\n    g = Graph('g')\n"
                    f"    g.source().to({body}).to(g.sink())\n    return g\n")
    return path


def test_loader_refuses_and_allow_module_allows(tmp_path: Path) -> None:
    path = write_graph(tmp_path, "g.map('json:loads')")
    with pytest.raises(FunctionNotAllowed, match=r"'json:loads' is not allowed.*--allow-module json"):
        load_graph(str(path))
    graph, _module = load_graph(str(path), Allowed.of(["json"]))
    assert graph.module == path.stem


def test_client_deploy_refuses_before_touching_the_cluster() -> None:
    g = Graph("shell")
    g.source().to(g.map("os:system")).to(g.sink())
    with Client("127.0.0.1:1", "nowhere") as client, pytest.raises(FunctionNotAllowed, match="'os:system'"):
        client.deploy(g)


# -- the command line --------------------------------------------------------------------------------------------


def test_run_refuses_a_shell_graph_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    events = tmp_path / "events.txt"
    events.write_text(f"touch {marker}\n")
    graph = write_graph(tmp_path, "g.map('os:system', balance='os:system')")
    done = cli("run", str(graph), "--input", str(events))
    assert done.returncode == 2, done.stderr
    assert "'os:system' is not allowed" in done.stderr and "--allow-module os" in done.stderr
    assert done.stdout == ""
    assert not marker.exists()


def test_run_with_allow_module(tmp_path: Path) -> None:
    events = tmp_path / "events.txt"
    events.write_text('["a", "b"]\n')
    graph = write_graph(tmp_path, "g.map('json:loads')")
    refused = cli("run", str(graph), "--input", str(events))
    assert refused.returncode == 2 and "--allow-module json" in refused.stderr
    done = cli("run", str(graph), "--input", str(events), "--allow-module", "json")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ['"a"', '"b"']


def test_allow_module_value_is_checked() -> None:
    done = cli("run", "examples/wordcount.py", "--input", "-", "--allow-module", "not a module")
    assert done.returncode == 2 and "is not a module name" in done.stderr


# -- a cluster ---------------------------------------------------------------------------------------------------


class OneNode:
    def __init__(self, data: Path, zookeeper: str, name: str) -> None:
        self.data, self.zookeeper, self.name = data, zookeeper, name

    def store(self) -> ClusterStore:
        """A session with the cluster's own ZooKeeper digest: it may write ticks, as whoever holds it could."""
        state = launcher.load_state(self.data)
        assert state is not None
        return ClusterStore(self.zookeeper, cluster=self.name, **launcher.store_auth(state))

    def ticks(self) -> int:
        with self.store() as store:
            return len(store.ticks())

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted((self.data / "logs").glob("*.log")))


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[OneNode]:
    """One node hosting every role (the lightest cluster), started with an --allow-module of its own."""
    data = tmp_path_factory.mktemp("allowed") / "cluster"
    name = f"allowed{uuid.uuid4().hex[:8]}"
    with running(data, zookeeper, name, "--nodes", "1", "--allow-module", "mylib_for_tests"):
        yield OneNode(data, zookeeper, name)


@pytest.mark.slow
def test_up_passes_allow_module_to_its_nodes(one_node: OneNode) -> None:
    started = "".join(p.read_text() for p in (one_node.data / "logs").glob("*.out"))
    assert "--allow-module mylib_for_tests" in started


@pytest.mark.slow
def test_deploy_refuses_a_shell_graph_and_publishes_nothing(one_node: OneNode, tmp_path: Path) -> None:
    before = one_node.ticks()
    graph = write_graph(tmp_path, "g.map('os:system')")
    done = cli("deploy", str(graph), "--zookeeper", one_node.zookeeper, "--cluster", one_node.name)
    assert done.returncode != 0
    assert "map 'map0': function 'os:system' is not allowed" in done.stderr
    assert "--allow-module os" in done.stderr
    assert one_node.ticks() == before


@pytest.mark.slow
def test_a_node_refuses_a_shell_tick_written_into_zookeeper(one_node: OneNode, tmp_path: Path) -> None:
    """The deployer's check is bypassed: the tick goes straight into ZooKeeper and even claims ``os`` as the
    graph's own module.  The worker and the front refuse it, and a pushed ``touch`` runs nowhere."""
    marker = tmp_path / "ran"
    with one_node.store() as store:
        (acker,) = store.members(ACKER).values()
        (worker,) = store.members(WORKER).values()
        (front,) = store.members(FRONT).values()
        (barrier,) = store.members(BARRIER).values()
        tick = Tick(number=0, start=GlobalTime(time.time_ns() // 1_000_000, 0), graph=shell_graph(module="os"),
                    layout=Layout.even(1), workers=(worker["address"],), fronts=(int(front["id"]),),
                    acker=acker["address"], barriers=((int(barrier["partitions"][0]), barrier["address"]),))
        number = store.publish_tick(tick.to_dict())
    deadline = time.monotonic() + 60
    # The positive signal first: the worker and the front each reported both refused references.
    while one_node.log().count("'os:system' is not allowed") < 4:
        assert time.monotonic() < deadline, one_node.log()
        time.sleep(0.2)
    log = one_node.log()
    assert f"tick {number}" in log and "cannot load the graph" in log and "worker0" in log
    with Client(one_node.zookeeper, one_node.name, retries=2) as client, pytest.raises(ClientError):
        client.push([f"touch {marker}"])  # the front has no graph it may run: the push is refused
    time.sleep(0.5)
    assert not marker.exists()
