"""The worker role: the whole graph over one hash range, hosted by a node.

``flamestream node --zookeeper HOST:PORT --worker I`` hosts worker I
(``WorkerRole`` in ``service.py``; at most one worker per node).  A thin asyncio
shell around ``flamestream.core.worker.Worker``: batches arriving on the
``Worker.Exchange`` streams (in-process from roles of the same node, gRPC from
other nodes) queue up, and one processing task drains the queue, merges what it
took in meta order (the paper's prioritized queue), runs the core, ships outputs
to the workers and barriers that own them, and sends one combined ack per step
to the acker — receipt of the inputs XOR-ed with the sends of the outputs, so
the acker's entry cannot reach zero in between.  The processing task is
essential: if it fails, the node stops with exit code 1.
"""
