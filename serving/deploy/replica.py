"""ModelServer: one engine replica as a Ray Serve deployment, routed by adapter version.

A call may carry a multiplexed model id (see `routing_id`). Ray Serve prefers a replica
that reported the id as loaded, so a request goes where its adapter is hot: the id of an
adapter request is its version, `name@digest`, and loading that "model" prefetches the
adapter into the slab. A re-uploaded adapter has a new digest, so it routes as a new
model, and the old version ages out of the slab like any other. Ray keeps its own LRU of
ids per replica (see models_per_replica); dropping an id only stops the replica from
attracting that adapter or session, so nothing is unloaded then.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

from ray import serve

from serving.api.generator import LocalGenerator
from serving.config import ServeConfig
from serving.deploy.engine_setup import build_engine
from serving.engine.figures import EngineFigures
from serving.engine.request import GenerateRequest, RequestOutput

SESSION_PREFIX = "session:"
# Sessions hash into this many routing ids per replica: enough to spread base-only
# conversations over the replicas, few enough to bound what they take of Ray's LRU.
SESSION_IDS_PER_REPLICA = 8
# Seconds a stopping replica waits for its streams to finish before it is killed.
DRAIN_TIMEOUT_S = 30.0


def routing_id(adapter: str | None, session: str | None, num_session_ids: int) -> str | None:
    """The multiplexed model id of a request: its adapter version, else its session's bucket
    (one of num_session_ids), else None.

    An adapter request goes where its version is hot, which also keeps a conversation on one
    replica while that replica holds it. A base-only conversation has no adapter to follow,
    so its session (the x-session-affinity header) picks its id: the first request loads the
    "model" on some replica and later ones prefer that replica, and its prefix cache. Sessions
    are hashed into a fixed set of ids, so however many a client invents they cannot crowd
    adapter versions out of Ray's LRU (see models_per_replica); sessions that share a bucket
    share a replica. Other base-only requests carry no id, so Ray balances them over all
    replicas by queue length (one shared id would pile them onto one replica).
    """
    if adapter:
        return adapter
    if session:
        # sha256, not hash(): every ingress replica must map a session to the same id.
        digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).digest()
        return f"{SESSION_PREFIX}{int.from_bytes(digest[:8], 'big') % num_session_ids}"
    return None


def num_session_ids(cfg: ServeConfig) -> int:
    """How many routing ids all sessions share: SESSION_IDS_PER_REPLICA per replica."""
    return SESSION_IDS_PER_REPLICA * cfg.deploy.num_replicas


def models_per_replica(cfg: ServeConfig) -> int:
    """Ray's max_num_models_per_replica: lora.max_loras adapter versions plus every session id.

    Even when one replica holds every session id, its lora.max_loras most recently used
    adapter versions keep their ids in Ray's LRU, so sessions never evict adapter affinity.
    """
    return cfg.lora.max_loras + num_session_ids(cfg)


MESSAGES_PER_SECOND = 640  # stream increments a replica sends, all streams together


def stream_pause(active_streams: int, longest: float) -> float:
    """Seconds a stream waits between messages: active_streams / MESSAGES_PER_SECOND, at most
    longest (one stream: ~2 ms; 64: 100 ms).

    Each increment is a message through Ray, and the messages compete with the engine for
    the cores; pacing keeps their total rate flat however many streams are open. The first
    token is never paced.
    """
    return min(longest, active_streams / MESSAGES_PER_SECOND)


@serve.deployment(graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S)
class ModelServer:
    """One engine (model, draft, adapter slabs, KV cache) behind a LocalGenerator."""

    def __init__(self, cfg: ServeConfig):
        self.engine = build_engine(cfg)
        replica = serve.get_replica_context().replica_id.unique_id
        self.generator = LocalGenerator(self.engine, cfg.server.max_queue, replica=replica)
        self.stream_interval = cfg.server.stream_interval_ms / 1000
        self.active_streams = 0

        async def load(model_id: str) -> str:
            if not model_id.startswith(SESSION_PREFIX):
                # Not awaited: the engine waits for the load itself and fails the request
                # with the load's own message; a full slab retries once a slot frees.
                self.engine.slab.prefetch(model_id)
            return model_id

        # Built here because the limit comes from the config.
        self._load = serve.multiplexed(max_num_models_per_replica=models_per_replica(cfg))(load)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs; a cancelled call aborts it in the engine."""
        if not self.engine.alive:  # queued, it would wait forever for a step
            raise RuntimeError("this replica's engine has stopped; retry the request")
        model_id = serve.get_multiplexed_model_id()
        if model_id:  # reported to Ray, which routes this id's next requests here
            await self._load(model_id)
        stream = self.generator.generate(request)
        self.active_streams += 1
        try:
            async for out in stream:
                yield out
                if not out.finished and self.stream_interval:
                    # Meanwhile the engine runs on and the stream merges what piles up.
                    await asyncio.sleep(stream_pause(self.active_streams, self.stream_interval))
        finally:
            self.active_streams -= 1
            # Cancellation lands here while the engine stream is suspended: closing it
            # runs its own cleanup, which aborts the request.
            await stream.aclose()

    async def figures(self) -> EngineFigures:
        """This replica's engine figures, labelled with its replica id."""
        (figures,) = await self.generator.figures()
        return figures

    async def ready(self) -> bool:
        """True once the engine is loaded and taking requests, while its step thread runs."""
        return self.engine.alive and await self.generator.ready()

    def check_health(self) -> None:
        """Ray Serve's periodic probe: raising makes it replace this replica."""
        if not self.engine.alive:
            raise RuntimeError("the engine's step thread has stopped")

    def __del__(self):
        # Ray Serve calls this once the replica has drained; it stops the step thread.
        generator = getattr(self, "generator", None)
        if generator is not None:
            generator.close()
