"""The acker service: one process holding the cluster's ack table (paper §3.3).

Fronts, workers and barriers stream XOR acks and fronts' reports to it; it
derives the minimal time and broadcasts every change to watchers (workers trim
grouping state with it, barriers release output below it).  A single acker is
what makes the minimal time one global, consistent value.
"""
