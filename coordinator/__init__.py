"""Coordinator-side services: the ZooKeeper server that holds the cluster layout."""

from flamestream.coordinator.zookeeper import ZooKeeperError, ZooKeeperServer

__all__ = ["ZooKeeperError", "ZooKeeperServer"]
