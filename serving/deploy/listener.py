"""A replica's own HTTP listener: clients reach the app on server.host:port with no proxy hop.

Every ModelServer replica listens on the same host and port with SO_REUSEPORT, so the
kernel spreads new connections over the replicas of a machine, a replica that restarts
binds the port again at once, and a replica that stops leaves the port to the others. A
request whose adapter another replica holds is still forwarded there (serving.deploy.ingress).

Ray Serve's HTTP proxy is not in the path: each stream increment it relayed was a Ray
message that competed with the engine for the cores (bench/README.md, "The server under
load"). What it gave, the listener gives by its own means:
- A replica that dies takes its connections with it: the kernel closes them, and a client
  reads a stream cut short (the OpenAI client raises APIConnectionError) or a refused
  connection, which clients retry. The next request reaches a live replica, or the
  restarted one as soon as it binds.
- A replica that stops (Ctrl-C, a redeploy, a scale-down) first stops accepting, then lets
  the streams in flight finish, up to its drain time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket

import ray
import uvicorn
from ray.serve.config import ProxyLocation
from ray.serve.context import _get_global_client
from starlette.types import ASGIApp

log = logging.getLogger("loraserve")
KEEP_ALIVE_S = 90  # seconds an idle client connection stays open


class ProxyEnabledError(RuntimeError):
    """Ray Serve runs HTTP proxies, which would hand the app requests past the listeners."""


def check_proxy_disabled() -> None:
    """ProxyEnabledError unless this Serve instance runs no HTTP proxy (blocking).

    Through a proxy the app would be a second way in, with the costs and the failure
    behaviour the listener removes; it would also take the port the listeners share.
    """
    # Private, but the only way to read the proxies' placement from inside a replica.
    client = _get_global_client()
    location = ray.get(client._controller.get_proxy_location.remote())
    if location not in (None, ProxyLocation.Disabled):
        raise ProxyEnabledError(
            f"Ray Serve runs HTTP proxies ({location.value}); loraserve's replicas listen on "
            f"server.host:server.port themselves. Start Serve with proxy_location: Disabled"
        )


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other replicas may bind too; OSError names it."""
    bare = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        held = exc.errno == errno.EADDRINUSE
        hint = (" Another server holds the port (a Ray Serve HTTP proxy? run Serve with "
                "proxy_location: Disabled)") if held else ""  # fmt: skip
        raise OSError(exc.errno, f"this replica cannot listen on {host}:{port}: "
                                 f"{exc.strerror}.{hint}") from None  # fmt: skip
    return sock


class ReplicaListener:
    """uvicorn serving `app` on host:port, as a task on the running event loop."""

    def __init__(self, app: ASGIApp, host: str, port: int, drain_s: float):
        self._sock = reuse_port_socket(host, port)
        config = uvicorn.Config(
            app,
            lifespan="off",  # the replica built the app's state; nothing to start
            access_log=False,
            log_config=None,
            # As Ray Serve's proxy had it: longer than a load balancer's idle timeout (nginx,
            # cloud balancers: 60 s), so the balancer, not this server, closes an idle
            # connection, and never one it is just sending a request on.
            timeout_keep_alive=KEEP_ALIVE_S,
            # The client is the TCP peer: an X-Forwarded-For header names no one (the gate's
            # key-guess limit counts peers, serving.api.edge.key_guesses).
            proxy_headers=False,
            # Streams still open once drain_s has passed are cut.
            timeout_graceful_shutdown=drain_s,
        )
        self._server = uvicorn.Server(config)
        # Never the process's signal handlers, whichever thread runs the loop: Ray keeps its
        # own, and a stream here is not cut by another server's exit (sse_starlette looks
        # for a uvicorn server behind SIGTERM's handler to end its streams when it exits).
        self._server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._sock])
        )

    @property
    def alive(self) -> bool:
        """Whether the server still runs: it has neither failed nor been drained."""
        return not self._task.done()

    async def drain(self) -> None:
        """Stop accepting, then wait for the requests in flight (at most drain_s)."""
        self._server.should_exit = True
        try:
            await self._task
        except Exception:  # the server's own failure: nothing is left to drain
            log.exception("the replica's HTTP listener failed while draining")
