"""The barrier role: the cluster's output stage (paper §3.1–§3.3).

``flamestream node --zookeeper HOST:PORT --barrier P[,P...] --data-dir DIR``
hosts the barrier of partitions P (``BarrierRole`` in ``service.py``).  Items
reaching a sink are delivered here and held in an invalidation buffer per
owned partition (a front id: an item and its invalidators share a global time,
hence a front) until the acker's minimal time passes them.  Released items are
final, so they are appended to a durable output topic that consumers read by
offset, Kafka-style, with consumer-group offsets kept beside each partition.
"""
