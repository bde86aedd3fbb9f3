"""docker-compose.yml runs the same cluster `flamestream up` does, checked statically (no Docker needed).

Every service command must equal what ``cluster_process.service_args`` builds
for its role, so a flag added to the services (and to ``up``) cannot be
forgotten in the compose file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flamestream import cluster_process
from flamestream.cluster_process import BARRIER, FRONT, MODULES, member_name, planned_services, service_args

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
ROLES = {member_name(role, index): (role, index) for role, index in planned_services(workers=2, fronts=1)}


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


def test_every_process_of_up_is_a_service() -> None:
    assert set(ROLES) <= set(SERVICES)
    assert {role for role, _ in ROLES.values()} == set(cluster_process.SERVICE_ROLES)


@pytest.mark.parametrize("name", sorted(ROLES))
def test_command_is_what_up_runs_for_the_role(name: str) -> None:
    role, index = ROLES[name]
    command = SERVICES[name]["command"]
    port = int(command[command.index("--port") + 1])
    data_dir = "/data" if role in (FRONT, BARRIER) else None
    assert command == ["python", *service_args(role, index, zookeeper="zookeeper:2181", cluster="default",
                                               data_dir=data_dir, host=name, port=port)]
    assert published(SERVICES[name]) == [(port, port)]  # reachable on the port it advertises


@pytest.mark.parametrize("name", sorted(ROLES))
def test_services_wait_for_zookeeper_and_keep_state_in_volumes(name: str) -> None:
    service = SERVICES[name]
    assert "zookeeper" in service["depends_on"]
    assert service.get("build") == "."
    if ROLES[name][0] in (FRONT, BARRIER):
        volume = next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == "/data")
        assert volume in COMPOSE["volumes"]


def test_published_ports_are_unique() -> None:
    hosts = [host for service in SERVICES.values() for host, _ in published(service)]
    assert len(hosts) == len(set(hosts))


def test_the_image_contains_every_service_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert set(MODULES.values()) | {"flamestream", "coordinator", "examples"} <= copied
