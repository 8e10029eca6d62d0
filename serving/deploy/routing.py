"""Which replica serves a request: its multiplexed id, and the ids a replica holds.

A request's id is its adapter version (`name@digest`), else its session's bucket, else none
(see `routing_id`). A replica holds an id once it has served it, as Ray's own LRU of
multiplexed ids does (`HeldIds` mirrors it, so the HTTP path can decide without asking Ray):
a request whose id is held where it arrives is served there, any other goes through the
AdapterRouter (serving.deploy.router) to a replica that holds its id.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from serving.config import ServeConfig

SESSION_PREFIX = "session:"
# Sessions hash into this many routing ids per replica: enough to spread base-only
# conversations over the replicas, few enough to bound what they take of Ray's LRU.
SESSION_IDS_PER_REPLICA = 8
# Adapter ids Ray keeps per replica at most, however large its slab: every replica reports
# its ids to every router, so they stay a short list.
MAX_ADAPTER_IDS = 1024
# An adapter is copied to one more replica once every replica holding it runs this share of
# max_num_seqs of its requests at once (see serving.deploy.router).
SPREAD_SHARE = 0.25


def routing_id(adapter: str | None, session: str | None, num_session_ids: int) -> str | None:
    """The multiplexed model id of a request: its adapter version, else its session's bucket
    (one of num_session_ids), else None.

    An adapter request goes where its version is hot, which also keeps a conversation on one
    replica while that replica holds it. A base-only conversation has no adapter to follow,
    so its session (the x-session-affinity header) picks its id: the first request loads the
    "model" on some replica and later ones prefer that replica, and its prefix cache. Sessions
    are hashed into a fixed set of ids, so however many a client invents they cannot crowd
    adapter versions out of Ray's LRU (see models_per_replica); sessions that share a bucket
    share a replica. Other base-only requests carry no id, so they are served where they
    arrive, and Ray balances arrivals over all replicas by queue length.
    """
    if adapter:
        return adapter
    if session:
        # sha256, not hash(): every replica must map a session to the same id.
        digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).digest()
        return f"{SESSION_PREFIX}{int.from_bytes(digest[:8], 'big') % num_session_ids}"
    return None


def num_session_ids(cfg: ServeConfig) -> int:
    """How many routing ids all sessions share: SESSION_IDS_PER_REPLICA per replica."""
    return SESSION_IDS_PER_REPLICA * cfg.deploy.num_replicas


def models_per_replica(cfg: ServeConfig, slab_pages: int) -> int:
    """Ray's max_num_models_per_replica: as many adapter versions as the replica's slab has
    pages (at most MAX_ADAPTER_IDS), plus every session id.

    A slab of N pages holds N adapters when each fits one page (rank page_rank or less), and
    fewer when they are larger: an id kept after its adapter left the slab sends its next
    request to a replica that refills it, from its host tier while it is there, rather than
    to one that never held it. Even when one replica holds every session id, its adapter
    versions keep their ids in Ray's LRU, so sessions never evict adapter affinity.
    """
    return min(slab_pages, MAX_ADAPTER_IDS) + num_session_ids(cfg)


def spread_at(cfg: ServeConfig) -> int:
    """Requests of one adapter in flight on each replica holding it before it is copied."""
    return max(1, round(SPREAD_SHARE * cfg.scheduler.max_num_seqs))


class HeldIds:
    """The ids a replica holds, least recently used first, as Ray's multiplex LRU keeps them."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def use(self, model_id: str) -> None:
        """Mark model_id used now; the least recently used id beyond capacity is dropped."""
        self._ids[model_id] = None
        self._ids.move_to_end(model_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
