"""What the streams between members share, and the event loop every node runs on.

A stream to another node is ``flamestream.runtime.frames.FrameStream``, one to
a role of the same node ``flamestream.runtime.channels.LocalStream``; both
break with ``StreamBroken``, and a receiver's handler ends either with
``LocalAbort``.  ``run`` starts a node's main coroutine on uvloop with the
collector and the GIL's switch interval tuned for stream state.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NoReturn

import grpc
import uvloop

from flamestream.cluster import host_port
from flamestream.runtime.heap import tune_gc

SWITCH_INTERVAL = 0.001
"""Seconds a thread may keep the GIL while another waits for it (``sys.setswitchinterval``; CPython's default 0.005).

Why shorter: a node's disk writes run in threads (snapshot files; the input
log's and the topic's appends with their fsyncs did until they moved onto the
loop while the disk is fast, ``flamestream.runtime.appends``), and each needs
the GIL back once its syscall returns.  While the event loop was busy, that took up
to the whole interval, on every record's path (input log, then topic).
Interleaved 20-30 s benches on this 2-core machine, default against 1 ms:
inverted index at 20 pages/s p50 68 / 72 -> 49 / 46 ms and 99 / 90 / 95 ->
70 / 89 / 69 ms; word count at 1,000 lines/s 41 / 37 -> 31 / 32 ms and
46 / 48 / 48 -> 30 / 40 / 46 ms.  0.5 ms was no better than the default, and
2 ms came between."""

CLOSE_TIMEOUT = 2.0
"""Seconds a closing stream waits for its receiver to confirm the end, so shutdown cannot hang on a dead peer."""


class StreamBroken(Exception):
    """A long-lived call failed; how much of what it carried arrived is unknown.

    ``peer``: the address of the other node ("" for an in-process stream), so the supervisor can ask whether
    anything still listens there (``refuses``).
    """

    def __init__(self, message: str, peer: str = "") -> None:
        super().__init__(message)
        self.peer = peer

    @classmethod
    def seen(cls, message: str, peer: str = "", cause: BaseException | None = None) -> StreamBroken:
        """A break seen by a watch rather than by a write, raised here so it carries a traceback like any logged
        failure (the point of detection, and ``cause``'s own below it: a local handler's exception)."""
        try:
            raise cls(message, peer) from cause
        except cls as error:
            return error


StreamHandler = Callable[[AsyncIterator[Any], Any], Coroutine[Any, Any, Any]]
"""A servicer's client-streaming method: (request iterator, context) -> response; what both kinds of stream call."""


class LocalAbort(Exception):
    """A local handler aborted its call, as ``context.abort`` does over gRPC."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class LocalContext:
    """The part of ``grpc.aio.ServicerContext`` the cluster's handlers use, for calls that never leave the node."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise LocalAbort(code, details)


PROBE_TIMEOUT = 1.0
"""Seconds ``refuses`` waits for a connection: no answer at all (a cut network) is not a refusal."""


async def refuses(address: str) -> bool:
    """Whether ``address`` (``host:port``) actively refuses a TCP connection: nothing listens there, so the
    process that served it is gone (the kernel of its host answered for it).  A connection that is accepted, or
    a timeout, or no route, is not proof of anything."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            _, writer = await asyncio.open_connection(*host_port(address))
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


CONNECT_WAIT = 2.0
"""Seconds a stream's first write waits for a connection that could not be made (``FrameStream._open``)."""


def never_connected(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call failed before it was sent, no connection to the peer having been made, while something
    listens there.  A refused connection is left out: nothing listens, so the process there is gone, and the
    stream breaks at once (the supervisor's probe then stops this node for the recovery)."""
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = exc.details() or ""
    return "failed to connect to all addresses" in details and "Connection refused" not in details


def describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service's main coroutine on uvloop, with the collector tuned for a growing heap and the GIL handed
    to waiting threads sooner (``SWITCH_INTERVAL``)."""
    tune_gc()
    sys.setswitchinterval(SWITCH_INTERVAL)
    uvloop.run(main())
