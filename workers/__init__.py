"""The worker service: the whole graph over one hash range, as a process.

A thin asyncio shell around ``flamestream.worker.Worker``: batches arriving on
the ``Worker.Exchange`` streams queue up, and one processing task drains the
queue, merges what it took in meta order (the paper's prioritized queue), runs
the core, ships outputs to the workers and barriers that own them, and sends
one combined ack per step to the acker — receipt of the inputs XOR-ed with the
sends of the outputs, so the acker's entry cannot reach zero in between.
"""
