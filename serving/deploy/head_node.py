"""The deployments that keep a store: one replica on Ray's head node, taking no CPU.

The Tenancy (usage.store) and the Batch deployment (batch.store) each own a SQLite file.
Run as a single replica on the head node, each names one file however often it restarts,
and every ModelServer replica's calls meet in it.
"""

from __future__ import annotations

from ray import serve

HEAD_NODE = "node:__internal_head__"  # a resource only Ray's head node has
# Every replica's calls meet at the one replica; each is brief (a lock, a commit, a query).
MAX_ONGOING = 1024


def on_head_node(name: str):
    """serve.deployment(name) as one replica on the head node, with num_cpus 0."""
    return serve.deployment(
        name=name,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001}},
        max_ongoing_requests=MAX_ONGOING,
    )
