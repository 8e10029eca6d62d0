"""Every HTTP answer names its request: an `x-request-id` header, as OpenAI's API sends one.

A client that sent its own (a proxy's, say) gets it back, so one id follows the request
through both logs; otherwise the server makes one. An id that is not a short printable
token is replaced rather than echoed into a header.
"""

from __future__ import annotations

import re
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
SANE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


class RequestId:
    """ASGI middleware: scope["state"]["request_id"] and the answer's x-request-id header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(HEADER.encode(), b"").decode("latin-1")
        rid = sent if SANE.fullmatch(sent) else f"req_{secrets.token_hex(16)}"
        scope.setdefault("state", {})["request_id"] = rid

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        await self.app(scope, receive, named)
