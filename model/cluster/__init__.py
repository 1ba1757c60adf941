"""Cluster shapes: workers, routers and the links between them, built from the topology."""
