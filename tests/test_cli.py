"""The `flamestream run` command, as a user runs it: a real subprocess, JSON lines out, exit code 2 on errors; and
where the CLI and the SDK look for a secured cluster's credentials."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flamestream import cli, roles
from flamestream.roles import SHARED_NODE_WEIGHT
from flamestream.runtime import launcher, tls
from flamestream.wire.security import ADVERTISED, ENV, ROLES, discover
from flamestream.workers.service import WorkerRole

ROOT = Path(__file__).resolve().parents[1]


def flamestream(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flamestream", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_run_prints_released_records_as_json_lines(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("the dog saw a dog\nA DOG and a cat\n")
    done = flamestream("run", "examples/wordcount.py", "--input", str(source), "--workers", "3", "--seed", "5",
                       "--stats")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records == [
        {"word": "the", "count": 1}, {"word": "dog", "count": 1}, {"word": "saw", "count": 1},
        {"word": "a", "count": 1}, {"word": "dog", "count": 2}, {"word": "a", "count": 2},
        {"word": "dog", "count": 3}, {"word": "and", "count": 1}, {"word": "a", "count": 3},
        {"word": "cat", "count": 1},
    ]
    assert json.loads(done.stderr.splitlines()[-1])["released"] == 10


def test_run_reads_stdin_and_oracle_agrees() -> None:
    text = "b a b\nc b\n"
    runtime = flamestream("run", "examples/wordcount.py", "--input", "-", "--workers", "4", "--adversarial",
                          stdin=text)
    oracle = flamestream("run", "examples/wordcount.py", "--input", "-", "--oracle", stdin=text)
    assert runtime.returncode == oracle.returncode == 0
    assert runtime.stdout == oracle.stdout
    assert json.loads(runtime.stdout.splitlines()[-1]) == {"word": "b", "count": 3}


def test_run_redeploy_at_hands_the_state_over_and_equals_the_oracle() -> None:
    """A tick boundary mid-input, 2 -> 3 workers: the counts carry on (a lost state would restart them at 1)."""
    text = "b a b\nc b a\nb c\na a b\n"
    oracle = flamestream("run", "examples/wordcount.py", "--input", "-", "--oracle", stdin=text)
    for at in ("1", "2", "3"):
        runtime = flamestream("run", "examples/wordcount.py", "--input", "-", "--workers", "2", "--adversarial",
                              "--redeploy-at", at, "--workers-after", "3", "--stats", stdin=text)
        assert runtime.returncode == 0, runtime.stderr
        assert sorted(runtime.stdout.splitlines()) == sorted(oracle.stdout.splitlines())
        assert json.loads(runtime.stdout.splitlines()[-1]) != {"word": "b", "count": 1}
    assert {"word": "b", "count": 5} in [json.loads(line) for line in oracle.stdout.splitlines()]


def test_stdin_goes_through_the_graphs_read_input_and_its_failure_is_one_line(tmp_path: Path) -> None:
    """``--input -`` skipped ``read_input``: piped pages became one event per line, each refused, exit 0."""
    pages = ('<pages><page id="1" title="a">the ball and the goal</page>'
             '<page id="2" title="b">a goal</page></pages>\n')
    (tmp_path / "pages.xml").write_text(pages)
    piped = flamestream("run", "examples/inverted_index.py", "--input", "-", stdin=pages)
    from_file = flamestream("run", "examples/inverted_index.py", "--input", str(tmp_path / "pages.xml"))
    assert piped.returncode == 0 and "rejected" not in piped.stderr, piped.stderr
    assert sorted(piped.stdout.splitlines()) == sorted(from_file.stdout.splitlines())
    assert len(piped.stdout.splitlines()) == 5 + 3  # a posting per distinct word of each title and text
    broken = flamestream("run", "examples/inverted_index.py", "--input", "-", stdin="not xml\n")
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "read_input('-') of examples.inverted_index failed: ParseError" in broken.stderr


def test_bad_invocations_exit_2_with_a_message(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from flamestream import Graph\ndef graph():\n    g = Graph('x')\n    g.source()\n    return g\n")
    shadowed = tmp_path / "json.py"  # the standard library's json is imported under that name
    shadowed.write_text(broken.read_text())
    cases = {
        ("run", str(shadowed), "--input", "x"): "importable only as module 'json', and that name is taken by",
        ("run", "examples/missing.py", "--input", "x"): "is not an existing .py file",
        ("run", "examples/wordcount.py", "--input", str(tmp_path / "nope.txt")): "No such file",
        ("run", "examples/wordcount.py", "--input", "x", "--workers", "0"): "must be >= 1",
        ("run", str(broken), "--input", "x"): "a graph needs at least one sink",
        ("run", "examples/wordcount.py", "--input", "-", "--redeploy-at", "2"): "the input has 0 events",
        ("run", "examples/wordcount.py", "--input", "-", "--workers-after", "2"): "--workers-after needs --redeploy-at",
        ("run", "examples/wordcount.py", "--input", "-", "--oracle", "--redeploy-at", "0"): "the oracle has no ticks",
        ("frobnicate",): "invalid choice",
    }
    for args, message in cases.items():
        done = flamestream(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)


def test_credentials_come_from_the_flag_the_environment_or_what_up_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CLI looks (``credentials_of``), first match wins; a recorded --insecure cluster is plaintext even
    when an earlier secured run left DIR/tls behind."""
    monkeypatch.delenv(ENV, raising=False)
    data = tmp_path / "cluster"
    tls.init(data / "tls")

    def found(*args: str) -> str | None:
        return cli.credentials_of(cli.build_parser().parse_args(["consume", *args]))

    assert found("--data-dir", str(data)) == str(data / "tls")  # no cluster.json: a copied data dir
    state = launcher.ClusterState(cluster="c", zookeeper="127.0.0.1:1", own_zookeeper=False)
    launcher.save_state(data, state)
    assert found("--data-dir", str(data)) is None  # recorded insecure
    state.tls_dir = str(tmp_path / "own")
    launcher.save_state(data, state)
    assert found("--data-dir", str(data)) == str(tmp_path / "own")
    assert found("--zookeeper", "127.0.0.1:1") is None  # left to the client: the nodes' advertisement
    assert found("--data-dir", str(data), "--credentials", "given") == "given"
    monkeypatch.setenv(ENV, "from-env")
    assert found("--zookeeper", "127.0.0.1:1") == "from-env"


def test_discovered_credentials_keep_their_zookeeper_digests_only_where_up_recorded_them(tmp_path: Path) -> None:
    directory = tls.init(tmp_path / "tls")
    tls.record_cluster(directory, "127.0.0.1:2181", "c")
    members = [{"address": "a:1", ADVERTISED: ""}, {"address": "b:1", ADVERTISED: str(directory)}]
    assert discover([{"address": "a:1", ADVERTISED: ""}, {"address": "b:1"}], "127.0.0.1:2181", "c") is None
    paired = discover(members, "127.0.0.1:2181", "c")
    assert paired is not None and set(paired.zookeeper) == {"service", "admin"} and set(paired.tokens) == set(ROLES)
    for zookeeper, cluster in (("localhost:2181", "c"), ("127.0.0.1:2181", "other")):
        unpaired = discover(members, zookeeper, cluster)
        assert unpaired is not None and unpaired.zookeeper == {} and unpaired.tokens == paired.tokens
    with pytest.raises(ValueError, match=f"is secured .* {ENV}=PATH"):
        discover([{ADVERTISED: str(tmp_path / "missing")}], "127.0.0.1:2181", "c")


def test_up_passes_the_memory_budget_to_workers_and_keeps_it_for_scale() -> None:
    args = cli.build_parser().parse_args(["up", "--memory-budget-mb", "800"])
    assert args.memory_budget_mb == 800
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--memory-budget-mb", "-1"])
    def node(plan: launcher.NodePlan) -> list[str]:
        return launcher.node_args(plan, zookeeper="zk:1", cluster="c", data_dir="/d", memory_budget_mb=800)

    worker = node(launcher.NodePlan("w", worker=1))
    assert worker[worker.index("--memory-budget-mb") + 1] == "800"
    assert "--memory-budget-mb" not in node(launcher.NodePlan("f", front=0))
    state = launcher.ClusterState(cluster="c", zookeeper="zk:1", own_zookeeper=False, memory_budget_mb=800)
    assert launcher.ClusterState.from_json(state.to_json()).memory_budget_mb == 800  # nodes `scale` adds get it


@pytest.mark.parametrize(("flags", "weight"), [
    ((), 1.0),  # a worker alone on its node
    (("--acker",), SHARED_NODE_WEIGHT),
    (("--front", "0", "--data-dir", "d"), SHARED_NODE_WEIGHT),
    (("--barrier", "0", "--data-dir", "d"), SHARED_NODE_WEIGHT),
    (("--front", "0", "--data-dir", "d", "--worker-weight", "2"), 2.0),  # the flag wins
])
def test_a_worker_beside_other_roles_registers_a_smaller_weight(flags: tuple[str, ...], weight: float) -> None:
    args = cli.build_parser().parse_args(["node", "--zookeeper", "z", "--worker", "1", *flags])
    assert roles.worker_weight(args) == weight
    assert WorkerRole(1, weight=roles.worker_weight(args)).info() == {"index": 1, "weight": weight}


@pytest.mark.parametrize("bad", ["0", "-1", "101", "nan", "inf", "heavy"])
def test_a_bad_worker_weight_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["node", "--zookeeper", "z", "--worker", "1", "--worker-weight", bad])
