"""Hand-over on a real cluster: state carried across redeploys and rescales while the stream keeps flowing.

Word count and the inverted index are pushed continuously while the cluster
is rescaled 2 -> 3 -> 2 workers (``flamestream scale``: new nodes, hand-over
ticks, nodes stopped) and the same graph is redeployed: the consumed topic
must equal the oracle over everything the fronts logged — the exact multiset
of (global time, payload) — so no count restarts, nothing is lost, nothing
is released twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples import inverted_index, wordcount
from flamestream import Graph, run_oracle
from flamestream.client import Client
from flamestream.cluster import ClusterStore
from flamestream.core.tick import Layout
from flamestream.storage.input_log import read_input_logs
from tests.test_cluster_e2e import as_multiset, cli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT.parent / "shared" / "data" / "wiki_football_ru.xml"


class Pusher(threading.Thread):
    """Pushes events one small batch at a time until stopped, like a steady source."""

    def __init__(self, zookeeper: str, cluster: str, events: Iterator[Any], pause: float, retries: int = 6) -> None:
        super().__init__(daemon=True)
        self.client = Client(zookeeper, cluster, retries=retries)
        self.events, self.pause = events, pause
        self.pushed = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = [event for event, _ in zip(self.events, range(2), strict=False)]
                if not batch:
                    return
                self.client.push(batch, producer="steady")
                self.pushed += len(batch)
                time.sleep(self.pause)
        except BaseException as exc:
            self.error = exc
        finally:
            self.client.close()


def lines() -> Iterator[str]:
    i = 0
    while True:
        yield f"the cat {i % 11} saw the dog {i % 5}"
        i += 1


def pages() -> Iterator[dict[str, Any]]:
    corpus = list(inverted_index.read_input(str(PAGES)))
    i = 0
    while True:
        page = corpus[i % len(corpus)]
        yield {**page, "id": f"{page['id']}~{i // len(corpus)}"}
        i += 1


WORKLOADS: dict[str, tuple[str, Callable[[], Graph], Callable[[], Iterator[Any]], float]] = {
    "wordcount": ("examples/wordcount.py", wordcount.graph, lines, 0.01),
    "inverted index": ("examples/inverted_index.py", inverted_index.graph, pages, 0.05),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_rescale_and_redeploy_mid_stream_equals_the_oracle(workload: str, tmp_path: Path) -> None:
    graph_file, graph, source, pause = WORKLOADS[workload]
    data = tmp_path / "cluster"
    up = cli("up", "--nodes", "2", "--data-dir", str(data))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        state = json.loads((data / "cluster.json").read_text())
        zookeeper, cluster = state["zookeeper"], state["cluster"]
        assert cli("deploy", graph_file, "--data-dir", str(data)).returncode == 0
        pusher = Pusher(zookeeper, cluster, source(), pause)
        pusher.start()
        steps = [("scale", "--workers", "3"), ("deploy", graph_file, "--rebalance"), ("scale", "--workers", "2")]
        for command, *rest in steps:
            before = pusher.pushed
            while pusher.pushed < before + 20 and pusher.is_alive():  # the stream flows between the steps
                time.sleep(0.05)
            if "--rebalance" in rest:
                with ClusterStore(zookeeper, cluster=cluster) as store:  # the workers' load reports
                    deadline = time.monotonic() + 30
                    while not store.loads() and time.monotonic() < deadline:
                        time.sleep(0.1)
            done = cli(command, *rest, "--data-dir", str(data))
            assert done.returncode == 0, f"{command} {rest}: {done.stdout}{done.stderr}"
        before = pusher.pushed
        while pusher.pushed < before + 20 and pusher.is_alive():
            time.sleep(0.05)
        pusher.stop.set()
        pusher.join(60)
        assert pusher.error is None, repr(pusher.error)

        expected = run_oracle(graph(), read_input_logs(data))[0]
        assert len(expected) > 0
        with Client(zookeeper, cluster) as client:
            got = []
            for record in client.consume(group="check", timeout=30):
                got.append((record.time, record.payload))
                if len(got) >= len(expected):
                    break
        assert as_multiset(got) == as_multiset(expected)
        with ClusterStore(zookeeper, cluster=cluster) as store:
            layouts = [Layout(tuple(data_["layout"])) for _n, data_ in store.ticks()]
        logs = "".join(path.read_text() for path in sorted((data / "logs").glob("node*.log")))
        # A tick more is a recovery: some node stopped; its log's errors say why.
        assert [layout.workers for layout in layouts] == [2, 3, 3, 2], "\n".join(
            line for line in logs.splitlines() if " ERROR " in line or " CRITICAL " in line)
        assert layouts[2] != Layout.even(3)  # cut by the measured load: the keys are skewed
        nodes = [p["name"] for p in json.loads((data / "cluster.json").read_text())["processes"] if p["role"] == "node"]
        assert nodes == ["node0", "node1"]  # node2 came and went
        assert logs.count("took over the state of tick") >= 2 + 3 + 2  # every new worker of every hand-over
    finally:
        down = cli("down", "--data-dir", str(data))
        assert down.returncode == 0, down.stderr
