"""AdapterRouter: Ray's multiplexed routing, plus copying a hot adapter to another replica.

Ray's power-of-two router sends a multiplexed id to the replicas that hold it, and looks
elsewhere only when they refuse work, so one popular adapter stays pinned to one replica
however busy it gets (ray-project/ray#65691). Yet one refused or slow queue-length probe
(its deadline is 0.1 s, which a busy host misses) sends the request to whichever replica
holds the fewest ids, so a cold adapter leaks onto a second replica and takes a slot there.
The rules here instead:

    an adapter is copied to one more replica once every replica holding it runs at least
    `spread_at` of its requests at once (routing.spread_at: a quarter of max_num_seqs),
    or runs `full_at` requests of any adapter (max_num_seqs: its batch is full, so the
    request would queue) while another replica runs fewer; the copy goes to the replica
    running the fewest requests. Otherwise a request goes to the replicas holding its
    adapter, and waits for one of them with Ray's backoff; only an id no replica holds is
    placed by Ray.

The replica that receives the copy loads the adapter and reports its id, so from then on
Ray's routing (and the HTTP path's serve-where-held rule) splits that adapter's requests
between both. A cold adapter never has that many requests in flight, so it stays on the one
replica that holds it while that replica has room. A copy is not undone: it lasts while the replica's LRU of ids keeps
the adapter (routing.models_per_replica), so a brief burst of one adapter may leave it on
two replicas for a while. The counts come from each replica's `record_routing_stats`
(`{"in_flight": {id: n}, "running": n}`), refreshed every ROUTING_STATS_PERIOD_S.
"""

from __future__ import annotations

# Ray's default router; its module is private, but the class is the documented default
# (RequestRouterConfig.request_router_class) and the only way to extend it.
import random

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

# Seconds between two routing-stats reports of a replica: a burst on one adapter is seen
# within this long (Ray's default of 10 s would leave it pinned for that long).
ROUTING_STATS_PERIOD_S = 0.5


def in_flight(replica: RunningReplica, model_id: str) -> int:
    """Requests of model_id the replica last reported running or queued."""
    return (replica.routing_stats or {}).get("in_flight", {}).get(model_id, 0)


def running(replica: RunningReplica) -> int:
    """Requests of any id the replica last reported running or queued."""
    return (replica.routing_stats or {}).get("running", 0)


def copy_target(
    replicas: list[RunningReplica], model_id: str, spread_at: int, full_at: int
) -> RunningReplica | None:
    """The replica that should take a copy of model_id now, or None to keep it where it is."""
    holders = [r for r in replicas if model_id in r.multiplexed_model_ids]
    others = [r for r in replicas if model_id not in r.multiplexed_model_ids]
    if not holders or not others:  # Ray places a new id; nowhere left to copy to
        return None
    target = min(others, key=running)
    if min(in_flight(r, model_id) for r in holders) >= spread_at:  # hot
        return target
    if min(running(r) for r in holders) >= full_at > running(target):  # its holders are full
        return target
    return None


def candidates(
    replicas: list[RunningReplica], model_id: str, spread_at: int, full_at: int
) -> list[RunningReplica]:
    """Where a request of model_id may go: [the copy target] when a copy is due, else the
    replicas holding model_id; [] when none holds it (Ray places it)."""
    target = copy_target(replicas, model_id, spread_at, full_at)
    if target is not None:
        return [target]
    return [r for r in replicas if model_id in r.multiplexed_model_ids]


class AdapterRouter(PowerOfTwoChoicesRequestRouter):
    """Power-of-two choices with multiplexing, and the copy rule of this module."""

    def initialize_state(self, spread_at: int, full_at: int, **kwargs):
        self.spread_at = spread_at
        self.full_at = full_at

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        model_id = pending_request.metadata.multiplexed_model_id if pending_request else ""
        chosen = (
            candidates(candidate_replicas, model_id, self.spread_at, self.full_at)
            if model_id
            else []
        )
        if chosen:
            # Retried after a pause while every chosen replica refuses work, as Ray's own
            # multiplexed choices are (without it the retry loop spins).
            pending_request.routing_context.should_backoff = True
            return [random.sample(chosen, min(2, len(chosen)))]  # the less busy of two
        return await super().choose_replicas(candidate_replicas, pending_request)
