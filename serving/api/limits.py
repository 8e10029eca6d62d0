"""Refuse request bodies above a size limit while they are read, before any route sees them.

A declared Content-Length above the limit is answered 413 at once, without reading; a body
sent in chunks is counted as it arrives and refused the moment it passes the limit. A body
within the limit is buffered whole and replayed to the app (routes read whole bodies
anyway), so the count is never bypassed by a route that reads in its own way.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.errors import send_error


class BodyLimit:
    """ASGI middleware: HTTP bodies larger than max_body_bytes get a 413 JSON answer."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(scope, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await self._refuse(scope, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        limit_mb = self.max_body_bytes / 2**20
        text = f"the request body is larger than the limit of {limit_mb:g} MiB"
        await send_error(send, scope.get("path", ""), 413, text)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server itself rejects a malformed length
    return None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that returns messages first, then whatever the client sends next."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
