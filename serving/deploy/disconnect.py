"""A client that leaves mid-answer is an `http.disconnect`, however Ray tells the app.

When the client of a streamed answer disconnects, Ray Serve cancels the request's task, and
the app's next `receive()` raises TaskCancelledError instead of returning the ASGI
`http.disconnect` message a server gives. The streaming response's disconnect listener then
fails with it, and the app logged an ordinary departure as an unhandled error. Wrapped here,
the app sees what any ASGI server would send: the request ends as a disconnect (aborted, 499).
"""

from __future__ import annotations

from ray.exceptions import TaskCancelledError
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class DisconnectOnCancel:
    """ASGI middleware: receive() raising TaskCancelledError -> {"type": "http.disconnect"}."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def receive_or_disconnect() -> Message:
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send)
