"""The front role: where events enter the stream (paper §2.1, §3.1.1, §3.3).

``flamestream node --zookeeper HOST:PORT --front F --data-dir DIR`` hosts front
F (``FrontRole`` in ``service.py``), alongside whatever other roles the node
has.  Clients call ``Front.Push``; for each batch of events the front

1. validates the whole request (size, JSON payload, the entry operation's
   balancing function) so a bad event admits nothing;
2. stamps every new event with a global time ``(ms, F)`` and the initial trace
   ``(seq,)`` (``flamestream.core.front.FrontClock``), at most ``CHUNK_BYTES``
   of events to a millisecond (a larger push spans the next ones);
3. writes one JSON record per event to its durable input log
   ``DIR/input/front-<F>`` (an acknowledged event survives a crash, and Spark
   replay and recovery read it from there);
4. sends each worker the envelopes whose entry hash it owns, on one long-lived
   ``Worker.Exchange`` stream per worker (FIFO, so a worker sees this front's
   items in increasing meta order; in-process when the worker is on the same
   node, gRPC otherwise), so the workers start while
5. the log is fsynced, and only then sends the acker the XOR of the send acks
   of all those batches with a report past the push's stamps: the acker cannot
   declare a time done before it has its send acks, nor before the front
   promised nothing older will come, so nothing of a push completes (and no
   output of it is released) before the push is durable.  A failure between
   steps 3 and 5 stops the front with its reports held below the push
   (``FrontService._unacked``); the recovery replays what the log holds;
6. replies with the global time of every event.

Steps 4 and 5 wait while the sends still in flight (not yet passed by the
acker's min time) reach ``SEND_WINDOW_BYTES``, and for a push above
``CHUNK_BYTES``: the events are logged and acknowledged, and a pacer sends them
in chunks of whole milliseconds as the min time moves, each followed by a
report no further than the next unsent event.  A burst sent at once reaches the
groupings from every worker in any order, and every late item replays the
newer ones of its key.  A recovery's re-send goes through the same pacer.

Every few milliseconds it reports to the acker the timestamp below which it will
never stamp again.  Pushes and reports share one lock, so a report is always
written after the acks of everything stamped before it.

Producers may make retries idempotent by setting ``producer`` and an increasing
``sequence``; ``flamestream.fronts.producers.ProducerTable`` remembers what was
admitted, and is rebuilt from the input log when the front restarts.

The deployment comes from the latest tick in ZooKeeper: the graph, the workers
and their hash ranges, the acker.  A stream that breaks makes the front refuse
pushes and stop reporting until the next tick: messages after a lost one are
lost too (one stream is one ordered connection), so continuing on a fresh
stream could let a report overtake acks the acker never received.  If the input
log fails and cannot be reopened, the node stops with exit code 1.
"""
