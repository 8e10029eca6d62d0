"""Every HTTP answer names its request: an `x-request-id` header, as OpenAI's API sends one.

A client that sent its own (a proxy's, say) gets it back, so one id follows the request
through both logs; otherwise the server makes one. An id that is not a short printable
token (`echoable`) is replaced rather than echoed into a header.
"""

from __future__ import annotations

import re
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from serving.api.edge.http_middleware import HttpMiddleware, first_headers

HEADER = "x-request-id"
SANE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def echoable(sent: str) -> bool:
    """Whether a client's x-request-id may be echoed: 1 to 128 of [A-Za-z0-9._:/+=-]."""
    return SANE.fullmatch(sent) is not None


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
