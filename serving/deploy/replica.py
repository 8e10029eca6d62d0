"""ModelServer: one engine replica that also serves the HTTP app, routed by adapter version.

Each replica listens on server.host:port itself (serving.deploy.listener; Ray Serve runs no
HTTP proxy), and the kernel hands it some of the machine's connections. Its app serves a
request on its own engine when it holds the request's routing id (routing.routing_id: the
adapter version `name@digest`, else a session bucket), or when the request has none.
Otherwise the app forwards it to the replica that holds the id, through a handle whose
AdapterRouter (serving.deploy.router) also copies a hot adapter to a second replica. So a
request reaches its engine with no Ray hop when it lands where its adapter is hot, and one
when it does not; the stream comes back the same way.

Holding an id means having served it, as Ray's multiplexed LRU keeps it: loading that "model"
prefetches the adapter into the slab, and Ray routes the id's next forwarded requests here. A
re-uploaded adapter has a new digest, so it routes as a new model, and the old version ages
out of the slab like any other. Dropping an id only stops the replica from attracting that
adapter or session, so nothing is unloaded then.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Mapping

from ray import serve
from ray.serve.handle import DeploymentHandle

from adapters.registry.registry import Registry
from serving.api.app import create_app
from serving.api.batch.items import run_item
from serving.api.core.caller import Principal
from serving.api.core.generator import LocalGenerator
from serving.api.core.settings import AppSettings, settings_from_config
from serving.batch.records import Item, ItemResult
from serving.config import ServeConfig
from serving.deploy.arrivals import Arrivals, is_resident
from serving.deploy.batch_service import HandleBatch
from serving.deploy.exposure import check_open_server
from serving.deploy.ingress import PeerReplicas, ReplicaGenerator
from serving.deploy.leases import Leases
from serving.deploy.listener import ReplicaListener, check_proxy_disabled
from serving.deploy.routing import SESSION_PREFIX, HeldIds, models_per_replica, num_session_ids
from serving.deploy.tenancy import HandleTenancy
from serving.engine.from_config import build_engine
from serving.engine.request import GenerateRequest, RequestOutput
from serving.engine.snapshot import EngineSnapshot
from serving.usage.outbox import outbox_for

# Seconds a stopping replica gives its streams to finish. A stop drains in two phases: Ray
# Serve first waits for the calls that came through Ray (streams forwarded here, batch
# items), then awaits the destructor, which stops the listener and waits for its streams
# (at most DRAIN_TIMEOUT_S). Ray kills the replica STOP_TIMEOUT_S after the stop began, so
# the first phase may take DRAIN_TIMEOUT_S before the second is cut short. Until the second
# the listener still takes connections, and serves them.
DRAIN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 2 * DRAIN_TIMEOUT_S + 5.0
# How often Ray Serve looks whether the calls through Ray are done (its default: 2 s).
DRAIN_POLL_S = 0.2
# Seconds between Serve's health checks of a replica. Serve learns that a replica died only
# at its next check, and starts another then; meanwhile a lone replica's port is refused.
# Serve's default is 10 s.
HEALTH_CHECK_PERIOD_S = 2.0


class EngineReplica:
    """One engine (model, draft, adapter slabs, KV cache) and the HTTP app in front of it."""

    def __init__(
        self,
        cfg: ServeConfig,
        keys: Mapping[str, Principal] | None = None,
        tenancy: DeploymentHandle | None = None,
        batch: DeploymentHandle | None = None,
    ):
        self.cfg = cfg
        self.keys = dict(keys or {})  # read where the app was built (see exposure)
        self.tenancy = tenancy  # the Tenancy deployment every replica shares (see tenancy)
        self.batch = batch  # the Batch deployment: the store, and the feeder that calls here
        self.engine = build_engine(cfg)
        self.leases = Leases(Registry(cfg.lora.registry), self.engine.slab)
        replica = serve.get_replica_context().replica_id.unique_id
        self.generator = LocalGenerator(self.engine, cfg.server.max_queue, replica=replica,
                                        stream_interval=cfg.server.stream_interval_ms / 1000)  # fmt: skip
        self.active_streams = 0
        self.held = HeldIds(models_per_replica(cfg, self.engine.slab.stats().pages))
        # routing id -> streams open here; an id leaves once its last stream ends, so the
        # table holds the ids of open streams only, not every adapter version ever served
        self.in_flight: Counter[str | None] = Counter()
        self.arrivals = Arrivals()

        async def load(model_id: str) -> str:
            if not model_id.startswith(SESSION_PREFIX):
                # Not awaited: the engine waits for the load itself and fails the request
                # with the load's own message; a full slab retries once a slot frees.
                self.engine.slab.prefetch(model_id)
            return model_id

        # Built here because the limit comes from the config; held mirrors its LRU.
        self._load = serve.multiplexed(max_num_models_per_replica=self.held.capacity)(load)

    async def __serve_build_asgi_app__(self):
        # Built per replica, after __init__. Raising here fails the replica: a keyless app
        # beyond loopback, or one behind Ray's proxy, never serves.
        settings = await asyncio.to_thread(self._settings)
        # build() published the preloads before binding this deployment; replica
        # readiness is the generator's to tell.
        settings.ready.set()
        context = serve.get_replica_context()
        peers = PeerReplicas(serve.get_deployment_handle(context.deployment, context.app_name))
        tenancy = None
        if self.tenancy is not None:  # what it cannot hand over waits in this node's outbox
            tenancy = HandleTenancy(self.tenancy, outbox_for(self.cfg.usage.store))
        batch = HandleBatch(self.batch) if self.batch is not None else None
        generator = ReplicaGenerator(self, peers, num_session_ids(self.cfg),
                                     alone=self.cfg.deploy.num_replicas == 1)  # fmt: skip
        app = create_app(generator, settings, tenancy, batch)
        self.metrics = app.state.context.metrics  # its request counts go out with figures()
        self.http_app = app  # batch items from the feeder are served through it
        server = self.cfg.server
        self.listener = ReplicaListener(app, server.host, server.port, DRAIN_TIMEOUT_S)
        return app

    def _settings(self) -> AppSettings:
        """The app's settings, once no proxy runs and server.host passes the open-server rule
        (blocking)."""
        server = self.cfg.server
        check_proxy_disabled()
        check_open_server([server.host], self.keys, server.insecure)
        # The keys file may exist only where the app was built, and this replica's env is
        # not the builder's: the keys passed in are the only ones.
        here = self.cfg.model_copy(
            update={"server": server.model_copy(update={"api_keys_file": None})}
        )
        return dataclasses.replace(settings_from_config(here), keys=self.keys)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """A request forwarded here by another replica's app; see serve_here. Its outputs
        travel back as Ray messages, paced as every stream is (LocalGenerator)."""
        model_id = serve.get_multiplexed_model_id() or None
        async for out in self.serve_here(request, model_id):
            yield out

    async def serve_here(
        self, request: GenerateRequest, model_id: str | None
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs from this engine; closing the stream aborts it."""
        if not self.engine.alive:  # queued, it would wait forever for a step
            raise RuntimeError("this replica's engine has stopped; retry the request")
        self.arrivals.record(request.adapter, is_resident(self.engine, request.adapter))
        if model_id:  # reported to Ray, which routes this id's next requests here
            self.held.use(model_id)
            await self._load(model_id)
        stream = self.generator.generate(request)
        self.active_streams += 1
        self.in_flight[model_id] += 1
        try:
            async for out in stream:
                yield out
        finally:
            self.active_streams -= 1
            left = self.in_flight[model_id] - 1
            if left:
                self.in_flight[model_id] = left
            else:
                del self.in_flight[model_id]
            # Cancellation lands here while the engine stream is suspended: closing it
            # runs its own cleanup, which aborts the request.
            await stream.aclose()

    async def run_batch_item(self, item: Item) -> ItemResult:
        """A batch item from the Batch deployment's feeder, served by this replica's app."""
        return await run_item(self.http_app, item)

    def record_routing_stats(self) -> dict:
        """What AdapterRouter reads: open streams per routing id, and in all."""
        # Ray runs this on a thread of its own while the loop adds and drops ids: a copy first
        ids = {k: n for k, n in list(self.in_flight.items()) if k and n > 0}
        return {"in_flight": ids, "running": self.active_streams}

    async def figures(self) -> EngineSnapshot:
        """This replica's engine figures, labelled with its replica id."""
        (figures,) = await self.generator.figures()
        metrics = getattr(self, "metrics", None)  # None until the app is built
        api = metrics.samples() if metrics is not None else ()
        state = {**figures.state, **(metrics.state_sizes() if metrics is not None else {})}
        state["routing_ids"] = (len(self.held), self.held.capacity)
        # ids of open streams (None, requests without an id, counted as one)
        state["routing_in_flight"] = (len(self.in_flight), None)
        recent = metrics.recent.buckets() if metrics is not None else ()
        return dataclasses.replace(
            figures, arrivals=self.arrivals.snapshot(), api=api, recent=recent, state=state
        )

    async def ready(self) -> bool:
        """True once the engine is loaded and taking requests, while its step thread runs."""
        return self.engine.alive and await self.generator.ready()

    def check_health(self) -> None:
        """Ray Serve's periodic probe: raising makes it replace this replica."""
        if not self.engine.alive:
            raise RuntimeError("the engine's step thread has stopped")
        listener = getattr(self, "listener", None)  # None until the app is built
        if listener is not None and not listener.alive:
            raise RuntimeError("the replica's HTTP listener has stopped")

    async def drain(self) -> None:
        """Stop accepting connections, let the streams in flight finish, then stop."""
        listener = getattr(self, "listener", None)
        if listener is not None:
            await listener.drain()
        self.close()

    def close(self) -> None:
        """Stop the step thread and the adapter leases at once."""
        generator = getattr(self, "generator", None)
        if generator is not None:
            generator.close()
        leases = getattr(self, "leases", None)
        if leases is not None:
            leases.close()


class _ServedReplica(EngineReplica):
    """The replica as Ray Serve runs it: its destructor drains."""

    async def __del__(self):
        # Ray Serve awaits this once the calls through Ray have drained (serve.ingress's
        # wrapper awaits a coroutine destructor, and drops what a plain one returns).
        await self.drain()


# The deployment; EngineReplica stays a plain class, so tests can build one outside Ray.
SERVER_NAME = "ModelServer"
ModelServer = serve.deployment(
    name=SERVER_NAME,
    graceful_shutdown_timeout_s=STOP_TIMEOUT_S,
    graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
)(serve.ingress()(_ServedReplica))
