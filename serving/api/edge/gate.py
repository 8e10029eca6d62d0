"""Who may reach the app at all, decided from the headers before any body is read.

With API keys configured, a request that carries a body (or uses any method but GET, HEAD
and OPTIONS) needs a valid key first: a missing or wrong key gets its 401 before the body
is read, so it cannot make the server buffer or parse megabytes. Bodiless GET and HEAD
requests are left to their routes, some of which (the probes, /metrics) take no key.

With no keys every caller is an admin, and the server listens on loopback only, which a
browser on the same machine still reaches: a page on any site may POST to 127.0.0.1
(forms and multipart uploads need no CORS preflight), and DNS rebinding points the page's
own name at 127.0.0.1 so that it may read the answers too. Hence, with no keys:
  - Host must name a loopback host (a rebound name fails), unless server.insecure says the
    server is meant to be reached under other names;
  - a request that changes state (POST, PUT, PATCH, DELETE) and carries an Origin (every
    browser sends one on such requests) must come from this server's own origin, the
    request's scheme and Host: another loopback origin is another local app's page
    (http://localhost:3000), no more to be trusted than any site's.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.errors import quoted
from serving.api.core.caller import PRINCIPAL, client_of
from serving.api.core.errors import ApiError, send_error
from serving.api.edge.http_middleware import HttpMiddleware, first_headers
from serving.api.edge.keys import KeyRing

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
# host or [IPv6], then an optional port: no user info, path or other surprises
_AUTHORITY = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>\d{1,5}))?\Z"
)
_ORIGIN = re.compile(r"^(?P<scheme>https?)://(?P<authority>[^/?#]+)\Z")
DEFAULT_PORTS = {"http": 80, "https": 443}  # the port an origin or Host leaves out


def is_loopback(host: str) -> bool:
    """Whether host (a name or an address, without port or brackets) is loopback."""
    if host.lower() == "localhost":
        return True  # other names may resolve anywhere, today or after a rebinding
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_authority(authority: str) -> bool:
    """Whether a Host header value (host[:port]) names a loopback host."""
    match = _AUTHORITY.match(authority)
    return match is not None and is_loopback(match["v6"] or match["name"])


class Gate(HttpMiddleware):
    """ASGI middleware ahead of the body limit: keys first, or the keyless browser checks."""

    def __init__(self, app: ASGIApp, ring: KeyRing, check_host: bool = True) -> None:
        super().__init__(app)
        self.ring, self.check_host = ring, check_host

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if PRINCIPAL in scope.get("state", {}):
            # A queued item run through the app (serving.api.batch.items) arrives with its principal set:
            # no client can set scope state, so it was authenticated when it was submitted.
            await self.app(scope, receive, send)
            return
        method, headers = scope["method"], first_headers(scope)
        try:
            if self.ring.open:
                self._check_browser(method, headers, scope.get("scheme", "http"))
            elif _may_carry_body(method, headers):
                principal = self.ring.identify(headers.get("authorization"), client_of(scope))
                # authenticate() reads it back rather than looking the key up again
                scope.setdefault("state", {})[PRINCIPAL] = principal
        except ApiError as exc:
            extra = [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
            path = scope.get("path", "")
            await send_error(send, path, exc.status, exc.message, exc.code, extra)
            return
        await self.app(scope, receive, send)

    def _check_browser(self, method: str, headers: dict[str, str], scheme: str) -> None:
        host = headers.get("host")
        if self.check_host and host is not None and not loopback_authority(host):
            raise ApiError(
                403,
                f"host {quoted(host)} is not served: with no API keys configured this server "
                "answers loopback names only (localhost, 127.0.0.1, [::1]); configure keys, "
                "or set server.insecure to serve other names",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if method in STATE_CHANGING and origin is not None and not _trusted(origin, scheme, host):
            raise ApiError(
                403,
                f"cross-origin request refused: origin {quoted(origin)} may not change state "
                "on a server with no API keys (only its own origin may)",
                code="cross_origin",
            )


def _trusted(origin: str, scheme: str, host: str | None) -> bool:
    """Whether a browser page at origin may change state here: only one of this server's own
    origin, scheme://Host ('null', and any origin when there is no Host, never may)."""
    match = _ORIGIN.match(origin)
    if match is None or host is None:
        return False
    own = _site(scheme, host)
    return own is not None and _site(match["scheme"], match["authority"]) == own


def _site(scheme: str, authority: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin's parts, the default port filled in; None if the
    authority is no plain host[:port]."""
    match = _AUTHORITY.match(authority)
    if match is None or scheme not in DEFAULT_PORTS:
        return None
    host = f"[{match['v6']}]" if match["v6"] else match["name"]
    return scheme, host.lower(), int(match["port"] or DEFAULT_PORTS[scheme])


def _may_carry_body(method: str, headers: dict[str, str]) -> bool:
    # A GET may carry a body too; only one that declares none is left to its route.
    declared = headers.get("content-length", "0").strip() != "0"
    return method not in BODYLESS or declared or "transfer-encoding" in headers
