"""Transport security of a secured cluster (``flamestream up``'s default): who may call which RPC, and the
credentials to prove it.

One port serves both peers (other nodes) and clients (SDK, CLI), so the
server requires a client certificate from everyone (mTLS) and then tells
them apart by the certificate's common name: node certificates are issued
as ``node:<name>``, the clients' shared certificate as ``client``.  The
internal services (``Worker.Exchange``, ``Barrier.Deliver``, ``Acker.*``)
accept only node certificates, because a forged exchange or ack breaks the
exactly-once guarantee for everyone; the public RPCs additionally need a
bearer token whose role allows the call (``push``, ``consume``; ``admin``
allows everything), because the client certificate is shared by every
user of the cluster and so proves only "signed by our CA".

Everything here is plain files read with the standard library (the wire
layer may not depend on ``cryptography``); ``flamestream.runtime.tls``
creates them.  Layout of a credentials directory (``DIR/tls`` after
``flamestream up``)::

    ca.pem                   cluster CA certificate (clients and nodes trust it)
    ca.key                   CA key, 0600 (only ``up``/nodes issuing their own certificate need it)
    nodes/<name>.pem, .key   node certificates (SAN = the node's advertised host)
    client.pem, client.key   the clients' certificate (CN "client")
    tokens.json              {"push": ..., "consume": ..., "admin": ...}, 0600
    zookeeper.json           {"service": "user:password", "admin": "user:password"}, 0600
    clusters.json            [["zookeeper host:port", "cluster"], ...]: the clusters ``up`` started with it

How a client finds them without being told (``discover``): every node of a
secured cluster advertises its directory's path in its (world-readable)
member info.  A path is not a secret, and anyone may advertise one, so the
discovered directory is trusted exactly as far as it proves itself: its CA
must verify the server before a token is sent (the TLS handshake), and its
ZooKeeper digests are offered only to a ZooKeeper and cluster its
``clusters.json`` lists — ZooKeeper authenticates nothing, and a digest sent
to another ZooKeeper is a digest given away.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client.key"
TOKENS = "tokens.json"
ZOOKEEPER = "zookeeper.json"
CLUSTERS = "clusters.json"
NODES = "nodes"
ENV = "FLAMESTREAM_CREDENTIALS"
"""Environment variable naming a credentials directory for the SDK and the CLI."""
ADVERTISED = "tls_dir"
"""Member info key: the credentials directory of a secured node ("" for a node serving plaintext)."""

PUSH, CONSUME, ADMIN = "push", "consume", "admin"
ROLES = (PUSH, CONSUME, ADMIN)
NODE_PREFIX = "node:"
"""Common name prefix of node certificates: what internal RPCs require of the caller."""
CLIENT_NAME = "client"

PUBLIC_METHODS = {
    "/flamestream.Front/Push": PUSH,
    "/flamestream.Barrier/Subscribe": CONSUME,
    "/flamestream.Barrier/Commit": CONSUME,
    "/flamestream.Barrier/Committed": CONSUME,
    "/flamestream.Barrier/Stats": CONSUME,
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
}
"""Methods clients may call and the token role each needs (None: any certificate signed by the CA).
Every other method is internal: it needs a node certificate (deny by default)."""


def node_cert_paths(directory: Path, node: str) -> tuple[Path, Path]:
    return directory / NODES / f"{node}.pem", directory / NODES / f"{node}.key"


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


class CredentialsError(ValueError):
    """A credentials directory that cannot be read: most often a wrong path, which the CLI says in one line."""


@dataclass(frozen=True)
class Credentials:
    """One process's view of a credentials directory: its own certificate, the CA, the tokens it holds.

    A client directory may hold only some tokens (e.g. only ``push``); a
    node's holds all of them, since it checks them.
    """

    directory: Path
    ca: bytes
    cert: bytes
    key: bytes
    tokens: dict[str, str] = field(default_factory=dict)
    zookeeper: dict[str, str] = field(default_factory=dict)
    """Digest credentials ``user:password`` by identity (``service``, ``admin``)."""

    @classmethod
    def load(cls, directory: str | Path, node: str | None = None) -> Credentials:
        """Read ``directory``; ``node``: use that node's certificate instead of the clients'."""
        directory = Path(directory)
        cert, key = node_cert_paths(directory, node) if node else (directory / CLIENT_CERT, directory / CLIENT_KEY)
        try:
            tokens = _read_json(directory / TOKENS) if (directory / TOKENS).exists() else {}
            zookeeper = _read_json(directory / ZOOKEEPER) if (directory / ZOOKEEPER).exists() else {}
            return cls(directory, (directory / CA_CERT).read_bytes(), cert.read_bytes(), key.read_bytes(),
                       {str(k): str(v) for k, v in tokens.items() if k in ROLES},
                       {str(k): str(v) for k, v in zookeeper.items()})
        except (OSError, ValueError) as exc:
            raise CredentialsError(f"cannot read credentials in {directory}: {exc}") from None

    def zookeeper_auth(self, identity: str) -> str | None:
        """The ``user:password`` digest of ``identity`` (``service`` or ``admin``), if this directory has it."""
        return self.zookeeper.get(identity)

    def token_for(self, method: str) -> str | None:
        """The token a client sends on ``method``: the role's own, else admin's (admin may do everything)."""
        role = PUBLIC_METHODS.get(method)
        return self.tokens.get(role or "", self.tokens.get(ADMIN)) if role else None

    def channel_credentials(self, with_tokens: bool) -> grpc.ChannelCredentials:
        """TLS with this certificate; ``with_tokens``: plus the bearer token each method needs (clients)."""
        tls = grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert)
        if not with_tokens or not self.tokens:
            return tls
        return grpc.composite_channel_credentials(tls, grpc.metadata_call_credentials(_TokenPlugin(self)))

    def ssl_context(self, server: bool) -> ssl.SSLContext:
        """The same mTLS for a socket (``flamestream.runtime.frames``): this certificate, the CA's to verify the
        peer, a peer certificate required both ways (a client also checks the server's name, as gRPC does)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.ca.decode())
        with tempfile.TemporaryDirectory() as private:  # the ssl module loads a key from a file only; 0700
            cert, key = Path(private, "cert.pem"), Path(private, "key.pem")
            cert.write_bytes(self.cert)
            key.touch(0o600)
            key.write_bytes(self.key)
            context.load_cert_chain(cert, key)
        return context

    def server_credentials(self) -> grpc.ServerCredentials:
        """mTLS: every caller must present a certificate signed by the cluster CA (checked in the handshake)."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)


class _TokenPlugin(grpc.AuthMetadataPlugin):
    """Adds ``authorization: Bearer <token>`` per call, choosing the token by the method called."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        token = self.credentials.token_for(context.method_name if context.method_name.startswith("/")
                                           else f"/{context.service_url.rsplit('/', 1)[-1]}/{context.method_name}")
        callback((("authorization", f"Bearer {token}"),) if token else (), None)


def find_credentials(explicit: str | os.PathLike[str] | None, data_dir: str | Path | None = None) -> Path | None:
    """Where a client's credentials are: ``explicit``, else ``$FLAMESTREAM_CREDENTIALS``, else ``DATA_DIR/tls``
    if that exists; None: not known yet (``discover`` may still find them in the members' advertisement)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    if data_dir is not None and (Path(data_dir) / "tls" / CA_CERT).exists():
        return Path(data_dir) / "tls"
    return None


def advertised(members: Iterable[dict[str, Any]]) -> Path | None:
    """The credentials directory secured members advertise (the first in path order if they differ, so every
    client picks the same one); None if none is secured."""
    paths = sorted({str(info.get(ADVERTISED) or "") for info in members} - {""})
    return Path(paths[0]) if paths else None


def clusters_of(directory: Path) -> list[tuple[str, str]]:
    """The (ZooKeeper, cluster) pairs ``up`` recorded in ``directory`` (none if it recorded none)."""
    try:
        pairs = json.loads((directory / CLUSTERS).read_text())
    except (OSError, ValueError):
        return []
    return [(str(p[0]), str(p[1])) for p in pairs if isinstance(p, list) and len(p) == 2] \
        if isinstance(pairs, list) else []


def discover(members: Iterable[dict[str, Any]], zookeeper: str, cluster: str) -> Credentials | None:
    """The credentials a client without any uses for ``cluster``, found through its members (see the module).

    None: the members serve plaintext.  The ZooKeeper digests are dropped
    unless the directory records this ZooKeeper and cluster.  A directory
    this process cannot read is a ValueError saying how to pass credentials.
    """
    directory = advertised(members)
    if directory is None:
        return None
    try:
        found = Credentials.load(directory)
    except ValueError as exc:
        raise ValueError(f"cluster {cluster!r} is secured (TLS, role tokens) and its credentials directory "
                         f"{directory} is not readable here ({exc}); pass credentials=PATH (CLI: --credentials "
                         f"PATH) or set {ENV}=PATH to a copy of it") from None
    if (zookeeper, cluster) in clusters_of(directory):
        return found
    return dataclasses.replace(found, zookeeper={})


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call of a secured node: node certificate for internal methods, token role for public ones.

    The check runs inside the handler because only the handler's context has
    the peer's ``auth_context()`` (the interceptor sees method and metadata
    only); the method is known up front, so the role needed is too.
    """

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = {role: token.encode() for role, token in tokens.items()}

    def check(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[grpc.StatusCode, str] | None:
        """None if the call may proceed, else the status and the message to abort with."""
        names = [n.decode() for n in context.auth_context().get("x509_common_name", [])]
        if method not in PUBLIC_METHODS:
            if any(name.startswith(NODE_PREFIX) for name in names):
                return None
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} is internal: only cluster nodes may call it"
        role = PUBLIC_METHODS[method]
        if role is None:
            return None
        metadata = dict(context.invocation_metadata() or ())
        header = str(metadata.get("authorization", ""))
        if not header.startswith("Bearer "):
            return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs a bearer token (role {role!r} or 'admin')"
        given = header.removeprefix("Bearer ").encode()
        held = [r for r, token in self.tokens.items() if hmac.compare_digest(token, given)]
        if not held:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown token"
        if role not in held and ADMIN not in held:
            return grpc.StatusCode.PERMISSION_DENIED, f"a {held[0]!r} token may not call {method} (needs {role!r})"
        return None

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        found = await continuation(handler_call_details)
        if found is None:
            return found
        handler: Any = found  # the aio server's behaviors are coroutines, which grpc's (sync) stubs do not describe
        method = handler_call_details.method
        checker = self

        async def deny(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            verdict = checker.check(method, context)
            if verdict is not None:
                await context.abort(*verdict)

        # One wrapper per response shape; the request side (one message or a stream) is passed through as is.
        def answering(inner: Any) -> Any:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await deny(context)
                return await inner(request, context)
            return call

        def streaming(inner: Any) -> Any:
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await deny(context)
                result = inner(request, context)
                if hasattr(result, "__aiter__"):
                    async for reply in result:
                        yield reply
                else:  # a handler writing with context.write
                    await result
            return call

        args = {"request_deserializer": handler.request_deserializer,
                "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(answering(handler.unary_unary), **args)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(answering(handler.stream_unary), **args)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **args)
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **args)
