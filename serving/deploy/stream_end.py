"""Middlewares for Ray Serve's HTTP proxy: an answer cut short by a dying replica ends cleanly,
/readyz says "starting" before any replica serves the app, and a client's x-request-id
reaches the proxy's own request naming (which echoes it) only where the app's rule
(serving.api.edge.request_id) would echo it.

The HTTP app runs on the replicas. When one dies while streaming, Ray's proxy has already
sent the status line and part of the body; it drops the replica's exception and returns
without ending the body, so the client sees a broken connection. This middleware, run in
the proxy, ends such an answer itself: a server-sent event stream gets a last error event
in the style of the route (serving.api.core.errors), then `data: [DONE]` where the route's
streams end so (all but the Responses API's), then the body is closed.

Ray Serve takes proxy middlewares only from a callback named in the proxy's environment
(PROXY_ENV): set it where Ray starts, before ray.init for a local Ray, in each node's
environment on a cluster or under KubeRay.
"""

from __future__ import annotations

import json

from starlette.middleware import Middleware
from starlette.types import Message, Receive, Scope, Send

from serving.api.core.errors import error_body
from serving.api.core.generation import DONE, REPLICA_FAILED
from serving.api.edge.http_middleware import HttpMiddleware
from serving.api.edge.request_id import SaneIncomingId

CUT_MESSAGE = REPLICA_FAILED  # as the app ends a stream whose replica broke off
RESPONSES = "/v1/responses"
# The environment that has Ray Serve's proxies run EndCutStreams.
PROXY_ENV = {
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serving.deploy.stream_end.proxy_middlewares"
}


class EndCutStreams(HttpMiddleware):
    """Ends an HTTP answer whose app returned after the status line but before the body's end."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = ended = events = False

        async def watch(message: Message) -> None:
            nonlocal started, ended, events
            if message["type"] == "http.response.start":
                started = True
                kind = dict(message.get("headers") or ()).get(b"content-type", b"")
                events = kind.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                ended = True
            await send(message)

        await self.app(scope, receive, watch)
        if started and not ended:
            body = b""
            if events:
                path = scope.get("path", "")
                data = [json.dumps(error_body(path, 500, CUT_MESSAGE))]
                if not path.startswith(RESPONSES):  # the Responses API's events end otherwise
                    data.append(DONE)
                body = "".join(f"data: {d}\r\n\r\n" for d in data).encode()
            await send({"type": "http.response.body", "body": body, "more_body": False})


class StartingProbe(HttpMiddleware):
    """/readyz answers 503 {"status": "starting"} while the app has no replica to answer it.

    The HTTP app runs on the replicas, so until one is up Ray's proxy knows no route and
    answers 404 (as after the last replica died): to a probe that is "not ready yet", the
    same answer the app gives while it loads (serving.api.admin.routes_ops).
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") != "/readyz":
            await self.app(scope, receive, send)
            return
        unrouted = False

        async def watch(message: Message) -> None:
            nonlocal unrouted
            if message["type"] == "http.response.start" and message["status"] == 404:
                unrouted = True
            if not unrouted:
                await send(message)

        await self.app(scope, receive, watch)
        if unrouted:
            body = json.dumps({"status": "starting"}).encode()
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})


def proxy_middlewares() -> list[Middleware]:
    """The proxy's middlewares, innermost first (Ray wraps its own request naming in them
    all, so the last runs first); also the callback Ray Serve imports from the environment."""
    return [Middleware(StartingProbe), Middleware(EndCutStreams), Middleware(SaneIncomingId)]
