"""API keys: who is calling (a tenant) and what they may do (scope user or admin).

Keys come from server.api_keys_file, one `KEY TENANT SCOPE` a line ('#' comments and
blank lines allowed), and from LORASERVE_API_KEYS=`KEY:TENANT:SCOPE,...`. A request sends
`Authorization: Bearer KEY`. With no keys configured every route is open and every caller
is the admin of tenant "default" (the server then binds only to loopback).

Rule (adapters.registry.visibility holds it): a key sees and uses its own tenant's adapters and the
public ones; it manages (uploads over, deletes) its own tenant's only. An admin key also
lists and manages every tenant's adapters and marks adapters public. The tenant `operator`
is reserved: it owns the operator's preloaded adapters, and no key may be given it.
Each key has a public id (`key-` and 12 hex digits of its SHA-256) that usage is metered by.
A key is at least MIN_KEY_LENGTH characters; a client sending many wrong ones is refused for
a while (see key_guesses).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from adapters.registry.names import OPERATOR
from serving.api.core.errors import ApiError
from serving.api.edge.key_guesses import KeyGuesses
from serving.config import ConfigError

log = logging.getLogger("loraserve.api")

SCOPES = ("user", "admin")
ENV_VAR = "LORASERVE_API_KEYS"
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
KEY_RE = re.compile(r"^[\x21-\x7e]+\Z")  # printable ASCII without spaces: fits a header
MIN_KEY_LENGTH = 16  # as the Helm chart's values schema asks
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


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

    def may_manage(self, owner: str) -> bool:
        """Whether this caller may change or inspect an adapter that owner owns."""
        return self.is_admin or owner == self.tenant


OPEN = Principal(
    tenant="default", scope="admin", key_id="open"
)  # every caller when no keys are configured


def load_keys(
    api_keys_file: str | Path | None, env: Mapping[str, str] | None = None
) -> dict[str, Principal]:
    """All configured keys, from the file and the environment; ConfigError names bad lines."""
    env = os.environ if env is None else env
    keys: dict[str, Principal] = {}
    entries = []
    if api_keys_file is not None:
        entries += _file_entries(Path(api_keys_file))
    if env.get(ENV_VAR, "").strip():
        entries += _env_entries(env[ENV_VAR])
    for where, key, tenant, scope in entries:
        if key in keys and keys[key] != Principal(tenant, scope):
            raise ConfigError(f"{where}: this key is already given to another tenant or scope")
        keys[key] = Principal(tenant, scope, key_id(key))
    return keys


def key_id(key: str) -> str:
    """The key's public id: it names the key in usage figures without revealing it."""
    return f"key-{hashlib.sha256(key.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"


def _file_entries(path: Path) -> list[tuple[str, str, str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: API keys file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the API keys file: {exc}") from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        _warn_shared(path, mode)
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if content:
            where = f"{path}, line {number}"
            entries.append((where, *_check(where, content.split())))
    return entries


@functools.cache  # once per file and mode: a start reads the keys more than once
def _warn_shared(path: Path, mode: int) -> None:
    log.warning("API keys file %s: group or others may read or write it (mode %03o): "
                "chmod 600 %s", path, mode, path)  # fmt: skip


def _env_entries(text: str) -> list[tuple[str, str, str, str]]:
    entries = []
    for number, item in enumerate(text.split(","), start=1):
        if item.strip():
            where = f"{ENV_VAR}, entry {number}"
            entries.append((where, *_check(where, item.strip().split(":"))))
    return entries


def _check(where: str, fields: list[str]) -> tuple[str, str, str]:
    if len(fields) != 3:
        raise ConfigError(f"{where}: expected KEY TENANT SCOPE, got {len(fields)} field(s)")
    key, tenant, scope = fields
    if not KEY_RE.match(key):
        raise ConfigError(f"{where}: a key must be printable ASCII without spaces")
    if not TENANT_RE.match(tenant):
        raise ConfigError(
            f"{where}: invalid tenant {tenant!r}: use 1-64 of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    if tenant == OPERATOR:
        raise ConfigError(
            f"{where}: the tenant {OPERATOR!r} is reserved for the operator's preloaded adapters"
        )
    if scope not in SCOPES:
        raise ConfigError(f"{where}: scope must be user or admin, got {scope!r}")
    if len(key) < MIN_KEY_LENGTH:  # the message names the tenant: the key is a secret
        raise ConfigError(
            f"{where}: the key of tenant {tenant!r} is shorter than {MIN_KEY_LENGTH} "
            "characters: give it a random key at least that long (openssl rand -hex 24)"
        )
    return key, tenant, scope


class KeyRing:
    """Looks keys up in time independent of where a presented key differs from a real one."""

    def __init__(self, keys: Mapping[str, Principal]) -> None:
        # Compare fixed-length digests, every one of them, so neither the position of the
        # first differing byte nor which key matched shows in the time taken.
        # Each principal carries its key's public id, however it was built.
        self._entries = [
            (_digest(k), p if p.key_id else dataclasses.replace(p, key_id=key_id(k)))
            for k, p in keys.items()
        ]
        self.guesses = KeyGuesses()  # wrong keys per client, shared by the gate and routes

    @property
    def open(self) -> bool:
        return not self._entries

    @property
    def secret(self) -> bytes:
        """Bytes only the holders of the keys can compute, alike in every process."""
        return hashlib.sha256(b"".join(sorted(d for d, _ in self._entries))).digest()

    def holder(self, key_id: str) -> Principal | None:
        """The caller whose key has this public id (see key_id), None if no key has."""
        return next((p for _, p in self._entries if p.key_id == key_id), None)

    def lookup(self, key: str) -> Principal | None:
        presented, found = _digest(key), None
        for digest, principal in self._entries:
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


_bearer = HTTPBearer(auto_error=False, description="An API key: Authorization: Bearer KEY")
PRINCIPAL = "loraserve.principal"  # where serving.api.edge.gate leaves the caller in scope["state"]


def identify(ring: KeyRing, authorization: str | None, client: str = "") -> Principal:
    """The caller an Authorization header names; 401 unless it is `Bearer KEY` with a known KEY,
    429 while client (see client_of) has sent too many wrong keys (see key_guesses)."""
    if ring.open:
        return OPEN
    scheme, _, key = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "missing API key: send the header Authorization: Bearer KEY",
            code="invalid_api_key",
            headers=_CHALLENGE,
        )
    wait = ring.guesses.retry_after(client)
    if wait is not None:
        raise ApiError(
            429,
            f"too many invalid API keys from this address: try again in {wait} s",
            code="too_many_invalid_keys",
            headers={"Retry-After": str(wait)},
        )
    principal = ring.lookup(key.strip())
    if principal is None:
        ring.guesses.wrong(client)
        raise ApiError(401, "invalid API key", code="invalid_api_key", headers=_CHALLENGE)
    return principal


def client_of(scope: Mapping) -> str:
    """The address an ASGI request's connection comes from, as the server saw it; "" if none."""
    client = scope.get("client")
    return client[0] if client else ""


def principal_of(request: Request) -> Principal:
    """The caller of request, as the gate found it or from its header; 401 without a key."""
    known = request.scope.get("state", {}).get(PRINCIPAL)
    if known is not None:
        return known
    ring, authorization = request.app.state.keys, request.headers.get("authorization")
    return identify(ring, authorization, client_of(request.scope))


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
