"""Adapter names and tenants: what a user may call an adapter, and how a version is written.

A user pins a version as 'name@digest'. Inside the server one version is identified
across tenants by its qualified form 'tenant/name@digest'; the digest alone names the
immutable files, so either form loads the same bytes.
"""

from __future__ import annotations

import re

from adapters.errors import AdapterError, quoted

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
DIGEST_RE = re.compile(r"^[0-9a-f]{64}\Z")
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Words the API and the registry layout use themselves; an adapter may not take them.
RESERVED = frozenset({"base", "none", "default", "latest", "versions", "names", "tmp"})
OPERATOR = "operator"  # the reserved tenant that owns the adapters an operator preloads


def validate_name(name: object) -> str:
    """Return name if it is a valid adapter name, else raise AdapterError saying why."""
    if not isinstance(name, str) or not name:
        raise AdapterError("invalid adapter name: a name is required")
    if ":" in name or "/" in name or "\\" in name or ".." in name:
        raise AdapterError(
            f"invalid adapter name {name!r}: ':', '/', '\\' and '..' are not allowed"
        )
    if not NAME_RE.match(name):
        raise AdapterError(
            f"invalid adapter name {name!r}: use 1-64 characters of a-z, 0-9, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if name in RESERVED:
        raise AdapterError(f"invalid adapter name {name!r}: it is reserved")
    return name


def validate_tenant(tenant: object) -> str:
    """Return tenant if it is a valid tenant (owner) name, else raise AdapterError saying why."""
    if not isinstance(tenant, str) or not tenant:
        raise AdapterError("invalid tenant: a non-empty string is required")
    if not TENANT_RE.match(tenant):
        raise AdapterError(
            f"invalid tenant {tenant[:80]!r}: use 1-64 characters of A-Z, a-z, 0-9, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return tenant


def parse_ref(ref: str) -> tuple[str, str | None]:
    """'name' -> (name, None); 'name@digest' -> (name, digest). Raises AdapterError."""
    name, sep, digest = ref.partition("@")
    validate_name(name)
    if not sep:
        return name, None
    if not DIGEST_RE.match(digest):
        raise AdapterError(
            f"invalid version {digest!r} in {ref!r}: expected 64 hex digits (sha256)"
        )
    return name, digest


def parse_version(version: str) -> tuple[str | None, str | None, str]:
    """'tenant/name@digest' -> (tenant, name, digest); 'name@digest' -> (None, name, digest);
    a bare digest -> (None, None, digest). Raises AdapterError for anything else."""
    if DIGEST_RE.match(version):
        return None, None, version
    label, sep, digest = version.rpartition("@")
    if not sep:
        raise AdapterError(
            f"invalid adapter version {quoted(version)}: expected '[tenant/]name@digest'"
        )
    tenant, slash, name = label.rpartition("/")
    if slash:
        validate_tenant(tenant)
    parse_ref(f"{name}@{digest}")
    return (tenant if slash else None), name, digest


def split_model(text: str) -> tuple[str | None, str]:
    """'base:name' -> ('base', 'name'); 'name' -> (None, 'name'). Only the last ':' splits,
    as a base model's id may hold one itself; neither part is checked."""
    base, sep, name = text.rpartition(":")
    return (base if sep else None), name


def qualified(tenant: str, name: str, digest: str) -> str:
    """The version's identity across tenants: 'tenant/name@digest'."""
    return f"{tenant}/{name}@{digest}"


def version_digest(version: str) -> str:
    """The digest of 'tenant/name@digest' or 'name@digest'; a string without '@' as it is."""
    return version.rpartition("@")[2]


def version_label(version: str | None) -> str:
    """What metrics label a version with: 'tenant/name' (or 'name'), without the digest."""
    if not version:
        return ""
    label, sep, _ = version.rpartition("@")
    return label if sep else version
