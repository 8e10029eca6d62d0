"""/ai/run and /ai/finetunes (under Cloudflare's account prefixes too) read their bodies as
JSON whatever the Content-Type says, as Workers AI's REST API does: Cloudflare's own
examples send it with curl -d (form-urlencoded) or fetch() with a string body (text/plain,
as wrangler does), and no Content-Type at all is common.

Only those three are taken for JSON; any other declared type (multipart, say) keeps its
400. Cross-origin browser writes on a keyless server are refused ahead of this (gate).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api.core.cloudflare_paths import ai_path

PREFIX = "/ai/run/"
FINETUNES = "/ai/finetunes"  # wrangler's create sends its JSON with no Content-Type
READ_AS_JSON = ("", "text/plain", "application/x-www-form-urlencoded")


class WorkersJsonBody:
    """ASGI middleware: a POST to /ai/run/... or /ai/finetunes (or an account's) with such a
    Content-Type is JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and _reads_json(ai_path(scope["path"]) or "")
        ):
            scope = _as_json(scope)
        await self.app(scope, receive, send)


def _reads_json(path: str) -> bool:
    return path.startswith(PREFIX) or path == FINETUNES


def _as_json(scope: Scope) -> Scope:
    headers = list(scope.get("headers") or [])
    declared = [v for k, v in headers if k.lower() == b"content-type"]
    kind = declared[0].decode("latin-1").split(";")[0].strip().lower() if declared else ""
    if kind not in READ_AS_JSON:
        return scope
    kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    return {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
