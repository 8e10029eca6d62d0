"""Who is calling: a tenant and its key's scope (user or admin), and how a route reads it.

With no keys configured every caller is OPEN, the admin of tenant "default" (the server
then binds only to loopback). The gate (serving.api.edge.gate) identifies a request that may
carry a body before it is read and leaves its caller in the ASGI scope; a bodiless request
is identified here, by the app's keys (app.state.keys, serving.api.edge.keys.KeyRing), when
its route asks. Who sees and manages which adapter is adapters.registry.visibility's rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from adapters.errors import AdapterError
from adapters.registry.names import validate_tenant
from serving.api.core.errors import ApiError

PRINCIPAL = "loraserve.principal"  # where serving.api.edge.gate leaves the caller in scope["state"]


@dataclass(frozen=True)
class Principal:
    """The caller: the tenant its key belongs to and the key's scope."""

    tenant: str
    scope: str  # "user" | "admin"
    # The key's public id, for usage metering; not part of equality (a key's rights are
    # its tenant and scope).
    key_id: str = field(default="", compare=False)

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


OPEN = Principal(
    tenant="default", scope="admin", key_id="open"
)  # every caller when no keys are configured


def key_id(key: str) -> str:
    """The key's public id: it names the key in usage figures without revealing it."""
    return f"key-{hashlib.sha256(key.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


class Keys(Protocol):
    """The app's API keys as the routes and queued items read them (app.state.keys)."""

    @property
    def open(self) -> bool:
        """Whether no key is configured: every caller is OPEN."""
        ...

    def holder(self, key_id: str) -> Principal | None:
        """The caller whose key has this public id (see key_id), None if no key has."""
        ...

    def identify(self, authorization: str | None, client: str = "") -> Principal:
        """The caller an Authorization header names; ApiError 401 or 429 if none."""
        ...


def client_of(scope: Mapping) -> str:
    """The address an ASGI request's connection comes from, as the server saw it; "" if none."""
    client = scope.get("client")
    return client[0] if client else ""


def principal_of(request: Request) -> Principal:
    """The caller of request, as the gate found it or from its header; 401 without a key."""
    known = request.scope.get("state", {}).get(PRINCIPAL)
    if known is not None:
        return known
    keys: Keys = request.app.state.keys
    return keys.identify(request.headers.get("authorization"), client_of(request.scope))


_bearer = HTTPBearer(auto_error=False, description="An API key: Authorization: Bearer KEY")


async def authenticate(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller of this request (a FastAPI dependency); 401 without a valid key."""
    return principal_of(request)


async def caller_if_any(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal | None:
    """The caller when a valid key (or none, keyless) is sent; None otherwise (a dependency)."""
    try:
        return principal_of(request)
    except ApiError:
        return None


def named_tenant(caller: Principal, tenant: str | None, what: str) -> str | None:
    """The tenant a query's ?tenant= names for caller: its own, or any valid one for an admin
    key (400 for a name no tenant can have, not an empty answer); None when none is named."""
    if tenant is None or tenant == caller.tenant:
        return tenant
    if not caller.is_admin:
        raise ApiError(
            403, f"this key sees the {what} of tenant {caller.tenant!r} only",
            code="permission_denied",
        )  # fmt: skip
    try:
        validate_tenant(tenant)
    except AdapterError as exc:
        raise ApiError(400, f"tenant: {exc}") from None
    return tenant
