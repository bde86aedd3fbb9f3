"""docker-compose.yml runs the same cluster `flamestream up` does, checked statically (no Docker needed).

Every node service's command must equal what ``launcher.node_args`` builds
for the node ``up`` plans under that name, so a flag added to the nodes (and
to ``up``) cannot be forgotten in the compose file. The deployment itself is
tested end to end in tests/test_compose_docker.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from flamestream import cli
from flamestream.runtime import launcher
from flamestream.runtime.launcher import NodePlan, node_args, plan_nodes
from flamestream.wire.security import Credentials

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
NODES: dict[str, NodePlan] = {plan.name: plan for plan in plan_nodes(nodes=2, fronts=1)}
DOCKERFILE = (ROOT / "Dockerfile").read_text()
IMAGE = "flamestream:local"
ZOOKEEPER_PORT = 2181
TLS_DIR = "/tls"


def interpolated(text: str) -> str:
    """``text`` as docker-compose reads it with no variables set: ``${VAR:-default}`` is the default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each of a service's ``ports``."""
    entries = []
    for entry in service.get("ports", []):
        address, host, container = interpolated(str(entry)).split(":")
        entries.append((address, int(host), int(container)))
    return entries


def zoo_cfg() -> dict[str, str]:
    """The ZooKeeper configuration the Dockerfile writes (``printf '%s\\n' key=value ... >.../zoo.cfg``)."""
    text = DOCKERFILE.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "zoo.cfg" in line)
    return dict(re.findall(r"\b([\w.]+)=(\S+)", line))


def test_the_image_is_built_once_from_debian_and_every_service_uses_it() -> None:
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE) == ["debian:bookworm-slim"]
    assert {name: service["image"] for name, service in SERVICES.items()} == dict.fromkeys(SERVICES, IMAGE)
    builders = {name: service["build"] for name, service in SERVICES.items() if "build" in service}
    assert list(builders) == ["zookeeper"]  # built once; everything else waits for zookeeper
    assert builders["zookeeper"]["context"] == "."
    assert builders["zookeeper"]["network"] == "host"  # apt and pip reach the registries only from the host network
    assert all("zookeeper" in service["depends_on"] for name, service in SERVICES.items() if name != "zookeeper")


def test_zookeeper_runs_from_the_image_on_every_interface() -> None:
    zookeeper = SERVICES["zookeeper"]
    command = zookeeper["command"]
    assert command[0] == "java" and "org.apache.zookeeper.server.quorum.QuorumPeerMain" in command
    config = zoo_cfg()
    assert command[-1] == "/etc/flamestream/zoo.cfg"
    assert config["clientPort"] == str(ZOOKEEPER_PORT)
    assert "clientPortAddress" not in config  # the other containers connect to it
    assert config["dataDir"].startswith("/data/")
    assert any(volume.split(":")[1] == "/data" for volume in zookeeper["volumes"])
    assert "srvr" in config["4lw.commands.whitelist"].split(",")  # the healthcheck's probe
    probe = zookeeper["healthcheck"]["test"][-1]
    assert "zookeeper_serving" in probe and f"'127.0.0.1:{ZOOKEEPER_PORT}'" in probe
    assert published(zookeeper) == []


def test_every_node_of_up_is_a_service() -> None:
    assert set(NODES) <= set(SERVICES)
    hosted = {role for plan in NODES.values() for role, _name in plan.members()}
    assert hosted == set(launcher.SERVICE_ROLES)


@pytest.mark.parametrize("name", sorted(NODES))
def test_command_is_what_up_runs_for_the_node(name: str) -> None:
    command = SERVICES[name]["command"]
    port = int(command[command.index("--port") + 1])
    assert command == ["python", *node_args(NODES[name], zookeeper=f"zookeeper:{ZOOKEEPER_PORT}",
                                            cluster="default", data_dir="/data", host=name, port=port,
                                            tls_dir=TLS_DIR)]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> ``volume`` or ``volume:ro`` of a service's named volumes."""
    found = {}
    for entry in service.get("volumes", []):
        volume, path, *mode = entry.split(":")
        found[path] = ":".join([volume, *mode])
    return found


def test_tls_init_creates_the_credentials_the_nodes_and_the_client_mount_read_only() -> None:
    """Secured like `up`: one-shot tls-init writes the credentials volume, the nodes serve mTLS with it (read-only),
    and wait for it; the client service finds the same volume through FLAMESTREAM_CREDENTIALS."""
    init = SERVICES["tls-init"]
    assert init["command"] == ["flamestream", "tls-init", TLS_DIR, *(arg for name in sorted(NODES)
                                                                   for arg in ("--node", name))]
    assert "restart" not in init  # one-shot
    assert mounts(init)[TLS_DIR] == "tls" and "tls" in COMPOSE["volumes"]
    for name in [*NODES, "client"]:
        service = SERVICES[name]
        assert mounts(service)[TLS_DIR] == "tls:ro", name
        assert service["depends_on"]["tls-init"]["condition"] == "service_completed_successfully", name
    assert SERVICES["client"]["environment"]["FLAMESTREAM_CREDENTIALS"] == TLS_DIR


def test_tls_init_issues_each_node_a_certificate_for_its_service_name(tmp_path: Path) -> None:
    """The tls-init service's own command, run here: node certificates name the host each node advertises."""
    command = SERVICES["tls-init"]["command"]
    directory = tmp_path / "tls"
    assert command[:3] == ["flamestream", "tls-init", TLS_DIR]
    assert cli.main(["tls-init", str(directory), *command[3:]]) == 0
    for name in NODES:
        cert = x509.load_pem_x509_certificate((directory / "nodes" / f"{name}.pem").read_bytes())
        hosts = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        node_command = SERVICES[name]["command"]
        assert node_command[node_command.index("--host") + 1] in hosts.get_values_for_type(x509.DNSName)
        assert node_command[node_command.index("--name") + 1] == name
    credentials = Credentials.load(directory)  # what the client service reads
    assert set(credentials.tokens) == {"push", "consume", "admin"} and set(credentials.zookeeper) == {"service",
                                                                                                      "admin"}


@pytest.mark.parametrize("name", sorted(NODES))
def test_nodes_wait_for_zookeeper_and_restart_on_failure(name: str) -> None:
    service = SERVICES[name]
    assert service["depends_on"]["zookeeper"]["condition"] == "service_healthy"
    assert service["restart"] == "on-failure"
    # The gRPC health check reads the node's own --host, --port, --name and --tls-dir from its command line, and
    # talks TLS: the node serves nothing else.
    probe = service["healthcheck"]["test"][-1]
    assert "/proc/1/cmdline" in probe and 'flag("--tls-dir")' in probe and "secure_channel" in probe
    assert "insecure_channel" not in probe


def test_nodes_share_their_data_dir_in_one_volume() -> None:
    """--data-dir is one directory the nodes of a cluster share; a named volume survives container restarts."""
    mounted = {}
    for name in NODES:
        command = SERVICES[name]["command"]
        if "--data-dir" in command:
            path = command[command.index("--data-dir") + 1]
            mounted[name] = next(v.split(":")[0] for v in SERVICES[name]["volumes"] if v.split(":")[1] == path)
    assert mounted, "no node has a data dir"
    assert len(set(mounted.values())) == 1
    assert set(mounted.values()) <= set(COMPOSE["volumes"])


def test_only_the_client_ports_are_published_on_loopback() -> None:
    """Clients talk to fronts and barriers: only their nodes are published, on 127.0.0.1 at the advertised port."""
    clients = {name for name, plan in NODES.items() if plan.front is not None or plan.barriers}
    for name, service in SERVICES.items():
        entries = published(service)
        if name not in clients:
            assert entries == [], name
            continue
        command = service["command"]
        port = int(command[command.index("--port") + 1])
        assert entries == [("127.0.0.1", port, port)], name


def test_the_client_service_is_the_cli_on_demand() -> None:
    client = SERVICES["client"]
    assert client["entrypoint"] == ["flamestream"]
    assert client["profiles"] == ["tools"]  # not started by `up`


def test_the_image_contains_every_service_package() -> None:
    linked = {path.name for path in (ROOT / "flamestream").iterdir() if path.is_symlink()}
    assert linked == {"fronts", "workers", "acker", "barrier", "coordinator"}
    assert "\nCOPY . /tmp/src\n" in DOCKERFILE
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*"  # everything stays out of the build context unless let in
    let_in = {line[1:] for line in rules if line.startswith("!")}
    assert linked | {"flamestream", "examples", "pyproject.toml", "README.md"} <= let_in
