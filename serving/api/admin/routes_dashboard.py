"""GET /dashboard: the operator's page, and its scripts and style, all from this package.

The page holds no data of its own: it asks the API with the key typed into it, so these
routes need no key. Only the files named in ASSETS are served (no path from the request
ever reaches the file system), and nothing the page loads comes from another host, so it
works on an air-gapped cluster; the Content-Security-Policy header holds the page to that.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response

from adapters.errors import quoted
from serving.api.core.errors import ApiError

router = APIRouter(tags=["Dashboard"])
FOLDER = Path(__file__).parent / "dashboard"
JS, CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
ASSETS = {
    "dashboard.css": CSS,
    "dashboard.js": JS,
    "api.js": JS,
    "dom.js": JS,
    "charts.js": JS,
    "live.js": JS,
    "adapters.js": JS,
    "upload.js": JS,
    "panels.js": JS,
    "memory.js": JS,
}
# Same origin only: no CDN, font or beacon can load, and no inline script can run.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded server's page is never stale
}


@router.get("/dashboard", summary="The dashboard page (HTML; the key is typed into it)",
            response_class=Response)  # fmt: skip
async def dashboard(request: Request) -> Response:
    page = _read("index.html")
    if request.app.state.keys.open:  # no key to ask for: the page connects on its own
        page = page.replace(b"<html ", b'<html data-keyless="true" ', 1)
    return Response(page, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/dashboard/{asset}", include_in_schema=False)
async def dashboard_asset(asset: str) -> Response:
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise ApiError(404, f"no such dashboard asset: {quoted(asset)}", code="not_found")
    return Response(_read(asset), media_type=media_type, headers=HEADERS)


@cache
def _read(name: str) -> bytes:
    """A file of the page (read once: the package does not change under a running server)."""
    return (FOLDER / name).read_bytes()
