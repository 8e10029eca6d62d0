"""Refuse request bodies above a size limit while they are read, before any route sees them.

Batch payloads (a queued Workers-AI batch, an uploaded batch file) have their own limit,
batch.max_payload_mb; adapter uploads theirs, the largest adapter the served model takes at
lora.max_lora_rank (AppSettings.max_upload_bytes); every other body has server.max_body_mb.

A compressed body (Content-Encoding) is answered 415: nothing here inflates it, so neither
the count nor the routes could read it. A declared Content-Length above the limit is
answered 413 at once, without reading; a body
sent in chunks is counted as it arrives and refused the moment it passes the limit. A body
within the limit is buffered whole and replayed to the app (routes read whole bodies
anyway), so the count is never bypassed by a route that reads in its own way.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.core.cloudflare_paths import ai_path
from serving.api.core.errors import send_error
from serving.api.edge.http_middleware import HttpMiddleware, first_headers

TRUE = frozenset({"1", "true", "on", "yes", "y", "t"})


class BodyLimit(HttpMiddleware):
    """ASGI middleware: HTTP bodies larger than max_body_bytes get a 413 JSON answer."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        max_batch_bytes: int | None = None,
        max_upload_bytes: int | None = None,
    ):
        super().__init__(app)
        self.max_body_bytes = max_body_bytes
        self.max_batch_bytes = max_batch_bytes if max_batch_bytes is not None else max_body_bytes
        self.max_upload_bytes = max_upload_bytes if max_upload_bytes is not None else max_body_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = first_headers(scope)
        encoding = headers.get("content-encoding", "").strip().lower()[:40]
        if encoding not in ("", "identity"):  # a compressed body would pass the count unread
            text = f"Content-Encoding {encoding!r} is not supported: send the body uncompressed"
            await send_error(send, scope.get("path", ""), 415, text)
            return
        kind = "batch" if _is_batch_payload(scope) else "upload" if _is_upload(scope) else "body"
        limit = {"batch": self.max_batch_bytes, "upload": self.max_upload_bytes}.get(
            kind, self.max_body_bytes
        )
        declared = _content_length(headers)
        if declared is not None and declared > limit:
            await self._refuse(scope, send, limit, kind)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._refuse(scope, send, limit, kind)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: Scope, send: Send, limit: int, kind: str) -> None:
        what, why = {
            "batch": ("batch payload", " (batch.max_payload_mb)"),
            "upload": ("adapter upload", ", a float32 adapter at lora.max_lora_rank on every "
                       "module"),
            "body": ("request body", " (server.max_body_mb)"),
        }[kind]  # fmt: skip
        text = f"the {what} is larger than the limit of {limit / 2**20:.4g} MiB{why}"
        await send_error(send, scope.get("path", ""), 413, text)


def _is_upload(scope: Scope) -> bool:
    """A POST of an adapter, or of one of a finetune's files (the routes take no other body)."""
    if scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    wing = ai_path(path) or ""
    return path == "/v1/adapters" or (
        wing.startswith("/ai/finetunes/") and wing.endswith("/finetune-assets")
    )


def _is_batch_payload(scope: Scope) -> bool:
    """A POST of a batch file, or of a Workers-AI batch (?queueRequest=true)."""
    path = scope.get("path", "")
    if path == "/v1/files":
        return True
    if not (ai_path(path) or "").startswith("/ai/run/"):
        return False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    # the values FastAPI reads as true for the route's bool parameter
    return any(v.lower() in TRUE for v in query.get("queueRequest", ()))


def _content_length(headers: dict[str, str]) -> int | None:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None  # none declared; the server itself rejects a malformed length


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that returns messages first, then whatever the client sends next."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
