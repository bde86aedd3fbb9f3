"""gRPC channel settings and the method paths of the long-lived streams between cluster members.

Shared by the SDK and the services: both must agree on message limits, and
the in-process channels of a node route by the same method paths as gRPC.
"""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RECONNECT_BACKOFF_MS = (100, 1000)
"""A channel whose connection failed tries again after 0.1 s, backing off to 1 s at most (gRPC's defaults: 1 s
to 120 s).  Members restart on the address they had, within a second or two; with the defaults a client or peer
that had tried while it was down reconnected seconds after it was back, which was most of a recovery's time."""
KEEPALIVE_MS = (10_000, 5_000)
"""An HTTP/2 ping after 10 s without traffic, answered within 5 s or the connection is closed.  Why: the streams
between members are long-lived and may sit idle (a front with no pushes, a re-send waiting for the min time), and a
connection cut without a reset (a network partition, a host that vanished) is otherwise noticed only when TCP gives
up retransmitting a write, many minutes later; with pings, its calls end within ~15 s and the stream counts as broken
(the min-time watch; the frames between nodes use TCP keepalive with these timings,
``flamestream.runtime.frames.KEEPALIVE``).  Pings may go while no data does (streams are idle by design), and a
server accepts them every 5 s (gRPC's default, 5 minutes, would answer these pings with GOAWAY "too_many_pings")."""
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
                ("grpc.keepalive_time_ms", KEEPALIVE_MS[0]),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_MS[1]),
                ("grpc.http2.max_pings_without_data", 0),
                # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS: the name differs from the constant's, and
                # gRPC ignores a name it does not know (``min_recv_...`` was set here, so idle streams broke).
                ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS[1])]

EXCHANGE = "/flamestream.Worker/Exchange"
DELIVER = "/flamestream.Barrier/Deliver"
ACK = "/flamestream.Acker/Ack"
"""Method paths of the client-streaming calls between cluster members."""


_default_credentials: grpc.ChannelCredentials | None = None
"""The node's own TLS identity (``use_tls``): every channel it opens to a peer presents it."""


def use_tls(credentials: grpc.ChannelCredentials | None) -> None:
    """Make ``channel()`` default to TLS with ``credentials`` (a ``--tls`` node sets its node certificate once,
    so the roles' channels need not carry it around); None: plaintext again."""
    global _default_credentials
    _default_credentials = credentials


def channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """The one place channels are made: TLS with ``credentials`` (or the node's, ``use_tls``), else plaintext."""
    credentials = credentials or _default_credentials
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.aio.secure_channel(address, credentials, options=GRPC_OPTIONS)
