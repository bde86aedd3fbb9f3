"""Shared fixtures: one real ZooKeeper server for every test that needs one (tests isolate by cluster name)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flamestream.coordinator.zookeeper import ZooKeeperServer
from tests.sparkcli import SparkCli

_clusters = itertools.count()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``scripts/test`` runs the suite on two workers): a test
    module runs on one worker, so its module fixtures start once, and every test that uses Spark runs on one
    worker, so only one worker starts the Spark JVMs of the session fixtures below."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            spark = {"spark", "spark_cli"} & set(getattr(item, "fixturenames", ()))
            item.add_marker(pytest.mark.xdist_group("spark" if spark else item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Address (HOST:PORT) of a real ZooKeeper started for this test session."""
    server = ZooKeeperServer(Path(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture
def cluster_name() -> str:
    """A fresh cluster name, so tests sharing the ZooKeeper never see each other's ticks or members."""
    return f"test{next(_clusters)}"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for every Spark test: start-up costs seconds."""
    from flamestream.spark.replay import spark_session

    session = spark_session("local[2]", "flamestream-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCli]:
    """One process for every test's ``flamestream`` Spark commands (tests/sparkcli.py: a cold Spark start each
    would cost ~40 s)."""
    with SparkCli(tmp_path_factory.mktemp("spark-cli") / "spark.log") as cli:
        yield cli


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """The data dir of a cluster the test starts with ``flamestream up``; taken down after the test if it is
    still recorded there (a failed assertion must not leave processes behind)."""
    path = tmp_path / "cluster"
    yield path
    if (path / "cluster.json").exists():
        subprocess.run([sys.executable, "-m", "flamestream", "down", "--data-dir", str(path)], capture_output=True,
                       timeout=180, check=False)
