"""A client that leaves mid-answer is an `http.disconnect`, however Ray tells the app.

When the client of a streamed answer disconnects, Ray Serve cancels the request's task, and
the app's next `receive()` raises TaskCancelledError instead of returning the ASGI
`http.disconnect` message a server gives. The streaming response's disconnect listener then
fails with it, and the app logged an ordinary departure as an unhandled error. Wrapped here,
the app sees what any ASGI server would send: the request ends as a disconnect (aborted, 499).
"""

from __future__ import annotations

from ray.exceptions import TaskCancelledError
from starlette.types import Message, Receive, Scope, Send

from serving.api.edge.http_middleware import HttpMiddleware


class DisconnectOnCancel(HttpMiddleware):
    """ASGI middleware: receive() raising TaskCancelledError -> {"type": "http.disconnect"}."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_or_disconnect() -> Message:
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send)
