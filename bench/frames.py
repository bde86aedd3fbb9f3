"""What one message of a stream between nodes costs: a grpc.aio client-streaming call vs frames (issue #13).

A receiver process serves the same handler both ways: a gRPC generic
client-streaming method, and ``flamestream.runtime.frames.FrameServer`` (what
a node runs).  This process writes ``ItemBatch`` messages (``--bytes`` of
items each) with a grpc.aio call, and with ``FrameStream`` (what a node's
``Channels`` opens to another node), both on uvloop as the nodes run, taking
turns over ``--rounds``:

- *busy*: ``--messages`` written back to back; CPU microseconds per message
  of the writer and of the receiver (each process's own CPU time);
- *idle*: one message every 10 ms; the one-way latency (the writer's clock in
  the message, the receiver's at the handler: one machine, one clock).

Prints one JSON object (medians over the rounds).

    python bench/frames.py [--rounds 3] [--messages 20000] [--bytes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from flamestream.runtime.frames import FrameServer, FrameStream, NodeServicer
from flamestream.wire import flamestream_pb2 as pb
from flamestream.wire import flamestream_pb2_grpc as rpc
from flamestream.wire.transport import EXCHANGE, GRPC_OPTIONS

IDLE_GAP = 0.01
IDLE_MESSAGES = 200


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Receiver:
    """The handler both transports call; it keeps each message's one-way latency and its own CPU per call."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.cpu = 0.0
        self.messages = 0

    async def Exchange(self, requests: AsyncIterator[pb.ItemBatch], context: Any) -> pb.Empty:
        started = cpu()
        async for batch in requests:
            self.latencies.append(time.time() - struct.unpack_from("d", batch.items)[0])
            self.messages += 1
        self.cpu += cpu() - started
        return pb.Empty()

    async def Report(self, request: pb.Empty, context: Any) -> pb.ItemBatch:
        """The figures since the last report (reset): JSON in the items field."""
        answer = {"latencies": sorted(self.latencies), "cpu": self.cpu, "messages": self.messages}
        self.latencies, self.cpu, self.messages = [], 0.0, 0
        return pb.ItemBatch(items=json.dumps(answer).encode())


async def serve(port_file: str) -> None:
    receiver = Receiver()
    server = grpc.aio.server(options=GRPC_OPTIONS)
    frames = FrameServer({EXCHANGE: receiver.Exchange}.get, None)
    rpc.add_NodeServicer_to_server(NodeServicer(frames), server)  # type: ignore[no-untyped-call]
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Receiver", {
        "Exchange": grpc.stream_unary_rpc_method_handler(receiver.Exchange, pb.ItemBatch.FromString,
                                                         pb.Empty.SerializeToString),
        "Report": grpc.unary_unary_rpc_method_handler(receiver.Report, pb.Empty.FromString,
                                                      pb.ItemBatch.SerializeToString)})])
    await frames.start("127.0.0.1")
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(f"{port_file}.new", "w") as out:
        out.write(str(port))
    os.rename(f"{port_file}.new", port_file)  # whole, or not there
    await server.wait_for_termination()


def message(size: int) -> pb.ItemBatch:
    return pb.ItemBatch(items=struct.pack("d", time.time()) + b"x" * size, sender=1)


async def run_grpc(channel: grpc.aio.Channel, count: int, gap: float, size: int) -> None:
    call = channel.stream_unary("/bench.Receiver/Exchange", request_serializer=pb.ItemBatch.SerializeToString,
                                response_deserializer=pb.Empty.FromString)()
    for _ in range(count):
        await call.write(message(size))
        if gap:
            await asyncio.sleep(gap)
    await call.done_writing()
    await call


async def run_frames(channel: grpc.aio.Channel, address: str, count: int, gap: float, size: int) -> None:
    stream = FrameStream[pb.ItemBatch](channel, EXCHANGE, "receiver", address)
    for _ in range(count):
        await stream.write(message(size))
        if gap:
            await asyncio.sleep(gap)
    await stream.close()


async def measure(address: str, rounds: int, count: int, size: int) -> dict[str, dict[str, float]]:
    channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    report = channel.unary_unary("/bench.Receiver/Report", request_serializer=pb.Empty.SerializeToString,
                                 response_deserializer=pb.ItemBatch.FromString)
    runs: dict[str, list[dict[str, float]]] = {}
    for turn in range(rounds):
        order = ("grpc", "frames") if turn % 2 == 0 else ("frames", "grpc")
        for transport in order:
            for mode, n, gap in (("busy", count, 0.0), ("idle", IDLE_MESSAGES, IDLE_GAP)):
                started = cpu()
                if transport == "grpc":
                    await run_grpc(channel, n, gap, size)
                else:
                    await run_frames(channel, address, n, gap, size)
                writer_cpu = cpu() - started
                figures = json.loads((await report(pb.Empty())).items)
                latencies = figures["latencies"]
                assert figures["messages"] == n, figures["messages"]
                runs.setdefault(f"{transport} {mode}", []).append({
                    "writer_us_per_message": 1e6 * writer_cpu / n,
                    "receiver_us_per_message": 1e6 * figures["cpu"] / n,
                    "one_way_p50_ms": 1e3 * latencies[len(latencies) // 2]})
    await channel.close()
    return {key: {name: round(statistics.median(run[name] for run in values), 3) for name in values[0]}
            for key, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000, help="messages of a busy run (default 20000)")
    parser.add_argument("--bytes", type=int, default=2_000, help="item bytes of a message (default 2000)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve(args.serve))
        return
    with tempfile.TemporaryDirectory() as directory:
        port_file = os.path.join(directory, "port")
        receiver = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
        try:
            while not os.path.exists(port_file):
                if receiver.poll() is not None:
                    raise SystemExit(f"the receiver exited {receiver.returncode}")
                time.sleep(0.05)
            with open(port_file) as answer:
                address = f"127.0.0.1:{answer.read()}"
            figures = uvloop.run(measure(address, args.rounds, args.messages, args.bytes))
        finally:
            receiver.terminate()
            receiver.wait()
    print(json.dumps({"machine": platform.node(), "python": platform.python_version(), "rounds": args.rounds,
                      "messages": args.messages, "bytes": args.bytes, **figures}, indent=2))


if __name__ == "__main__":
    main()
