"""Creating a secured cluster's credentials: CA, node and client certificates, tokens, ZooKeeper digests.

``flamestream.wire.security`` reads them; this module writes them, and is
the only one that needs ``cryptography`` (the SDK only reads PEM files).
Anything already present is kept, which is how a user brings their own CA
(``ca.pem`` + ``ca.key``) or prepared node certificates (``nodes/<name>.pem``
+ ``.key``, no CA key needed then): only what is missing is created.  A node
whose certificate is missing issues its own at start-up for the host it
advertises, so nodes on other hosts (or added by ``scale``) need only the CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flamestream.wire.security import (
    CA_CERT,
    CA_KEY,
    CLIENT_CERT,
    CLIENT_KEY,
    CLIENT_NAME,
    CLUSTERS,
    NODE_PREFIX,
    ROLES,
    TOKENS,
    ZOOKEEPER,
    clusters_of,
    node_cert_paths,
)

VALID_DAYS = 825


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically with ``mode`` from the start, so a secret is never readable by others even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def create_ca(directory: Path, name: str = "flamestream cluster CA") -> None:
    """A self-signed CA (``ca.pem``, ``ca.key`` 0600) unless ``ca.pem`` is already there."""
    if (directory / CA_CERT).exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (_builder(name, subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    _write(directory / CA_KEY, _key_pem(key), 0o600)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def issue(directory: Path, common_name: str, hosts: Iterable[str], cert_path: Path, key_path: Path) -> None:
    """A certificate signed by the CA of ``directory`` for ``hosts`` (IP or DNS SANs), usable by server and client:
    a node is both (it serves, and it opens channels to its peers)."""
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError:
        raise ValueError(f"cannot issue a certificate for {common_name}: {directory / CA_KEY} is missing (bring "
                         f"{cert_path} and {key_path} yourself, or the CA key)") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"{directory / CA_KEY}: unsupported key type {type(ca_key).__name__}")
    ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(common_name, ca.subject, key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def ensure_node_cert(directory: Path, node: str, host: str) -> None:
    """``nodes/<node>.pem`` for ``host`` (plus ``localhost``/127.0.0.1 for local tools), unless one exists."""
    cert, key = node_cert_paths(directory, node)
    if cert.exists() and key.exists():
        return
    issue(directory, f"{NODE_PREFIX}{node}", [host, "127.0.0.1", "localhost"], cert, key)


def init(directory: Path, nodes: Iterable[tuple[str, str]] = ()) -> Path:
    """Everything a secured cluster needs in ``directory``, keeping what exists; ``nodes``: (name, host).

    Tokens are 32 random bytes each, one per role; the ZooKeeper digests are
    two identities, ``service`` (the nodes) and ``admin`` (deploy, scale).
    """
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    create_ca(directory)
    for name, host in nodes:
        ensure_node_cert(directory, name, host)
    if not (directory / CLIENT_CERT).exists():
        issue(directory, CLIENT_NAME, [], directory / CLIENT_CERT, directory / CLIENT_KEY)
    if not (directory / TOKENS).exists():
        tokens = {role: secrets.token_urlsafe(32) for role in ROLES}
        _write(directory / TOKENS, json.dumps(tokens, indent=2).encode(), 0o600)
    if not (directory / ZOOKEEPER).exists():
        digests = {identity: f"flamestream-{identity}:{secrets.token_urlsafe(24)}" for identity in ("service", "admin")}
        _write(directory / ZOOKEEPER, json.dumps(digests, indent=2).encode(), 0o600)
    return directory


def record_cluster(directory: Path, zookeeper: str, cluster: str) -> None:
    """Note in ``directory`` that ``up`` started ``cluster`` at ``zookeeper`` with it: a client that discovers the
    directory offers its ZooKeeper digests only there (``flamestream.wire.security.discover``)."""
    pairs = clusters_of(directory)
    if (zookeeper, cluster) not in pairs:
        _write(directory / CLUSTERS, json.dumps([*map(list, pairs), [zookeeper, cluster]]).encode(), 0o644)
