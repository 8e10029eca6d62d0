"""The HTTP side of a ModelServer replica: serve a request here, or forward it to a peer.

ReplicaGenerator is the app's Generator in each replica (serving.deploy.replica): a request
whose routing id this replica holds, or that has none, or any request where this replica is
the deployment's only one, runs on this replica's engine; any other goes through
PeerReplicas, a handle to the same deployment whose AdapterRouter picks the replica that
holds the id. A forwarded call is cancelled when its stream is left early
(a client disconnect, an error), which aborts the request in that replica's engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from serving.api.core.generator import QueueFull
from serving.deploy.routing import routing_id
from serving.engine.request import GenerateRequest, Priority, RequestOutput
from serving.engine.snapshot import EngineSnapshot

# A probe of every replica must answer within this, or the app does not count as ready.
PROBE_TIMEOUT_S = 5.0


class PeerReplicas:
    """The ModelServer deployment's replicas, this one included, through a handle."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle

    async def forward(
        self, request: GenerateRequest, model_id: str
    ) -> AsyncIterator[RequestOutput]:
        """The outputs of the replica Ray routes model_id to; leaving early cancels its call."""
        # Over gRPC between the replicas (`_by_reference=False`), not a Ray streaming task:
        # the replicas run the app on their own event loop (deploy.app.REPLICA_ENV), and a
        # task's stream read there sometimes stopped short of its last outputs, which the
        # holder had sent, so the answer never ended.
        handle = self._handle.options(
            stream=True, multiplexed_model_id=model_id, _by_reference=False
        )
        response = handle.generate.remote(request)
        finished = False
        try:
            async for out in response:
                finished = out.finished
                yield out
                if finished:
                    # The last output: the answer is whole without waiting for Ray to close
                    # the stream as well.
                    return
        except BackPressureError as exc:  # deploy.max_queued_requests reached
            raise QueueFull(str(exc)) from None
        except RayTaskError as exc:
            # Over gRPC the replica's own exception (QueueFull, ValueError) arrives as it was
            # raised; one that Ray wrapped on the way is unwrapped, so that the API shows the
            # client its message rather than Ray's wrapper that carries the traceback.
            raise exc.cause from None
        finally:
            if not finished:
                # The replica's generator is cancelled, and its engine aborts the request,
                # freeing its KV blocks and adapter pin.
                response.cancel()

    async def figures(self) -> list[EngineSnapshot]:
        """Every live replica's figures; a replica that fails to answer is left out."""
        answers = await self._probe("figures")
        return [a for a in answers if isinstance(a, EngineSnapshot)]

    async def _probe(self, method: str) -> list:
        """method's answer from each running replica, an exception where one failed."""
        try:
            broadcast = self._handle.broadcast(method)
            return await broadcast.results_async(timeout_s=PROBE_TIMEOUT_S, return_exceptions=True)
        except (TimeoutError, RayError, RayServeException):
            # No replica yet, or one hangs or is dying: no answers, never a failed scrape.
            return []


class ReplicaGenerator:
    """serving.api's Generator of one ModelServer replica: its engine, else a peer's."""

    def __init__(self, server, peers: PeerReplicas, num_session_ids: int, alone: bool = False):
        """alone: the deployment has this one replica, so no peer can hold an id it lacks."""
        self._server = server  # the ModelServer: serve_here(request, model_id), held
        self._peers = peers
        self._num_session_ids = num_session_ids
        self._alone = alone

    async def generate(
        self, request: GenerateRequest, *, session: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Outputs from this engine when it holds the request's id, else from a peer's.

        A batch item runs here whatever its adapter: the Batch deployment's feeder spreads
        items over the replicas, which run them in whatever capacity they have left, and the
        engine loads the item's adapter as it would any other's.
        """
        model_id = None
        if request.priority != Priority.BATCH:
            model_id = routing_id(request.adapter, session, self._num_session_ids)
        # A lone replica serves an id it does not hold yet itself: forwarding would only reach
        # it again over Ray, once Serve lists it as running (seconds after it listens, when
        # it has just replaced a replica that died).
        if model_id is None or self._alone or model_id in self._server.held:
            stream = self._server.serve_here(request, model_id)
        else:
            stream = self._peers.forward(request, model_id)
        async with aclosing(stream):
            async for out in stream:
                yield out

    async def figures(self) -> list[EngineSnapshot]:
        return await self._peers.figures()

    async def ready(self) -> bool:
        """This replica's own readiness: a connection the kernel hands it is served here or
        forwarded, so a load balancer's probe asks the replica that listens."""
        return await self._server.ready()
