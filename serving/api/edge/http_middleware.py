"""The shape of our ASGI middlewares: HTTP requests are theirs, every other scope passes by.

A server sends lifespan (and, were a route to take one, websocket) scopes through the same
stack; none of our middlewares has anything to say about them, so each hands them on as
they came. Every middleware of the app (the edge's) takes this shape.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """ASGI middleware whose handle() sees each HTTP request; any other scope goes to app untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request: answer it, or hand it on to self.app."""
        raise NotImplementedError


def first_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name, the first of each repeated one (as
    Starlette's Headers.get reads them)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found
