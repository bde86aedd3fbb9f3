"""docker-compose.yml runs the same cluster `flamestream up` does, checked statically (no Docker needed).

Every node service's command must equal what ``launcher.node_args`` builds
for the node ``up`` plans under that name, so a flag added to the nodes (and
to ``up``) cannot be forgotten in the compose file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flamestream.runtime import launcher
from flamestream.runtime.launcher import NodePlan, node_args, plan_nodes

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
NODES: dict[str, NodePlan] = {plan.name: plan for plan in plan_nodes(nodes=2, fronts=1)}


def published(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) pairs of a service's ``ports``."""
    pairs = []
    for entry in service.get("ports", []):
        host, _, container = str(entry).rpartition(":")
        pairs.append((int(host), int(container)))
    return pairs


def test_zookeeper_is_the_official_image_on_2181() -> None:
    zookeeper = SERVICES["zookeeper"]
    assert zookeeper["image"].split(":")[0] == "zookeeper"
    assert (2181, 2181) in published(zookeeper)
    assert "healthcheck" in zookeeper  # what the other services' depends_on waits for


def test_every_node_of_up_is_a_service() -> None:
    assert set(NODES) <= set(SERVICES)
    hosted = {role for plan in NODES.values() for role, _name in plan.members()}
    assert hosted == set(launcher.SERVICE_ROLES)


@pytest.mark.parametrize("name", sorted(NODES))
def test_command_is_what_up_runs_for_the_node(name: str) -> None:
    command = SERVICES[name]["command"]
    port = int(command[command.index("--port") + 1])
    assert command == ["python", *node_args(NODES[name], zookeeper="zookeeper:2181", cluster="default",
                                            data_dir="/data", host=name, port=port)]
    assert published(SERVICES[name]) == [(port, port)]  # reachable on the port it advertises


@pytest.mark.parametrize("name", sorted(NODES))
def test_services_wait_for_zookeeper_and_keep_state_in_volumes(name: str) -> None:
    service = SERVICES[name]
    assert "zookeeper" in service["depends_on"]
    assert service.get("build") == "."
    plan = NODES[name]
    if plan.front is not None or plan.barriers:
        volume = next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == "/data")
        assert volume in COMPOSE["volumes"]


def test_published_ports_are_unique() -> None:
    hosts = [host for service in SERVICES.values() for host, _ in published(service)]
    assert len(hosts) == len(set(hosts))


def test_the_image_contains_every_service_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    linked = {path.name for path in (ROOT / "flamestream").iterdir() if path.is_symlink()}
    assert linked == {"fronts", "workers", "acker", "barrier", "coordinator"}
    assert linked | {"flamestream", "examples"} <= copied
