"""Every HTTP answer names its request: an `x-request-id` header, as OpenAI's API sends one.

A client that sent its own (a proxy's, say) gets it back, so one id follows the request
through both logs; otherwise the server makes one. An id that is not a short printable
token (`echoable`) is replaced rather than echoed into a header. Under Ray Serve the proxy
names answers instead, echoing a client's id as is: `SaneIncomingId` runs ahead of it there
(serving.deploy.stream_end) and drops an id this rule would not echo.
"""

from __future__ import annotations

import re
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.edge.http_middleware import HttpMiddleware, first_headers

HEADER = "x-request-id"
SANE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def echoable(sent: str) -> bool:
    """Whether a client's x-request-id may be echoed: 1 to 128 of [A-Za-z0-9._:/+=-]."""
    return SANE.fullmatch(sent) is not None


class SaneIncomingId:
    """ASGI middleware ahead of a proxy that echoes a client's x-request-id as it came (Ray
    Serve's): the first one passes on if echoable, any other is dropped, so that the proxy
    names the request itself rather than echo an unprintable or huge header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            sent, name = first_headers(scope).get(HEADER, ""), HEADER.encode()
            headers = [(n, v) for n, v in scope.get("headers") or () if n.lower() != name]
            if echoable(sent):
                headers.append((name, sent.encode("latin-1")))
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


class RequestId(HttpMiddleware):
    """ASGI middleware: scope["state"]["request_id"] and the answer's x-request-id header."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = first_headers(scope).get(HEADER, "")
        rid = sent if echoable(sent) else f"req_{secrets.token_hex(16)}"
        scope.setdefault("state", {})["request_id"] = rid

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        await self.app(scope, receive, named)
