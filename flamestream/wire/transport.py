"""gRPC channel settings and the method paths of the long-lived streams between cluster members.

Shared by the SDK and the services: both must agree on message limits, and
the in-process channels of a node route by the same method paths as gRPC.
"""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]

EXCHANGE = "/flamestream.Worker/Exchange"
DELIVER = "/flamestream.Barrier/Deliver"
ACK = "/flamestream.Acker/Ack"
"""Method paths of the client-streaming calls between cluster members."""


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
