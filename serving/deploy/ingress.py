"""The HTTP ingress under Ray Serve: the FastAPI app over a Generator that calls ModelServer.

The app is the same one `serving.api` serves in-process; only its Generator differs.
RayGenerator routes each request by its multiplexed id (replica.routing_id), streams the
replica's outputs back, and cancels the replica's call when the stream is left early
(a client disconnect, an error), which aborts the request in that replica's engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping

from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from serving.api.app import create_app
from serving.api.auth import Principal
from serving.api.generator import QueueFull
from serving.api.settings import AppSettings, settings_from_config
from serving.config import ServeConfig
from serving.deploy.exposure import check_open_server, serve_proxy_host
from serving.deploy.replica import DRAIN_TIMEOUT_S, num_session_ids, routing_id
from serving.engine.figures import EngineFigures
from serving.engine.request import GenerateRequest, RequestOutput

# A probe of every replica must answer within this, or the app does not count as ready.
PROBE_TIMEOUT_S = 5.0


class RayGenerator:
    """serving.api's Generator over the ModelServer deployment's replicas."""

    def __init__(self, handle: DeploymentHandle, num_replicas: int, num_session_ids: int):
        self._handle = handle
        self._num_replicas = num_replicas
        self._num_session_ids = num_session_ids

    async def generate(
        self, request: GenerateRequest, *, session: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The replica's stream of outputs; leaving it early cancels the replica's call."""
        model_id = routing_id(request.adapter, session, self._num_session_ids)
        handle = self._handle.options(stream=True)
        if model_id is not None:
            handle = handle.options(multiplexed_model_id=model_id)
        response = handle.generate.remote(request)
        finished = False
        try:
            async for out in response:
                finished = out.finished
                yield out
        except BackPressureError as exc:  # deploy.max_queued_requests reached
            raise QueueFull(str(exc)) from None
        except RayTaskError as exc:
            # The replica's own exception (QueueFull, ValueError), whose message the API
            # shows to the client, rather than Ray's wrapper that carries the traceback.
            raise exc.cause from None
        finally:
            if not finished:
                # The replica's generator is cancelled, and its engine aborts the request,
                # freeing its KV blocks and adapter pin.
                response.cancel()

    async def figures(self) -> list[EngineFigures]:
        """Every live replica's figures; a replica that fails to answer is left out."""
        answers = await self._probe("figures")
        return [a for a in answers if isinstance(a, EngineFigures)]

    async def ready(self) -> bool:
        """True once every configured replica is up and its engine is taking requests."""
        answers = await self._probe("ready")
        return len(answers) >= self._num_replicas and all(a is True for a in answers)

    async def _probe(self, method: str) -> list:
        """method's answer from each running replica, an exception where one failed."""
        try:
            broadcast = self._handle.broadcast(method)
            return await broadcast.results_async(timeout_s=PROBE_TIMEOUT_S, return_exceptions=True)
        except (TimeoutError, RayError, RayServeException):
            # No replica yet, or one hangs or is dying: no answers, never a failed scrape.
            return []


@serve.deployment(ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S)
@serve.ingress()
class Ingress:
    """Serves the loraserve HTTP API; generation goes to the ModelServer replicas."""

    def __init__(
        self, model_server: DeploymentHandle, cfg: ServeConfig, keys: Mapping[str, Principal]
    ):
        self._server = model_server
        self._cfg = cfg
        self._keys = dict(keys)  # read where the app was built (see exposure)

    async def __serve_build_asgi_app__(self):
        # Built per replica, after __init__, so the app holds this replica's handle.
        # Raising here fails the replica: a keyless app beyond loopback never serves.
        settings = await asyncio.to_thread(self._settings)
        # build() published the preloads before binding this deployment; replica
        # readiness is the generator's to tell.
        settings.ready.set()
        generator = RayGenerator(
            self._server, self._cfg.deploy.num_replicas, num_session_ids(self._cfg)
        )
        return create_app(generator, settings)

    def _settings(self) -> AppSettings:
        """The app's settings, once the proxy's host passes the open-server rule (blocking)."""
        server = self._cfg.server
        check_open_server([server.host, serve_proxy_host()], self._keys, server.insecure)
        # The keys file may exist only where the app was built, and this replica's env is
        # not the builder's: the keys passed in are the only ones.
        here = self._cfg.model_copy(
            update={"server": server.model_copy(update={"api_keys_file": None})}
        )
        return dataclasses.replace(settings_from_config(here), keys=self._keys)
