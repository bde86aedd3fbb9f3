"""The acker role: the one holder of the cluster's ack table (paper §3.3).

``flamestream node --zookeeper HOST:PORT --acker`` hosts it (``AckerRole`` in
``service.py``), on any one node of the cluster.  Fronts, workers and barriers
stream XOR acks and fronts' reports to it; it derives the minimal time and
broadcasts every change to watchers (workers trim grouping state with it,
barriers release output below it).  Roles on the acker's own node reach it
in-process, others over gRPC.  A single acker is what makes the minimal time
one global, consistent value.
"""
