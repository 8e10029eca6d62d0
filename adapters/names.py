"""Adapter names: what a user may call an adapter, and how a version is pinned (name@digest)."""

from __future__ import annotations

import re

from adapters.errors import AdapterError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
# Words the API and the registry layout use themselves; an adapter may not take them.
RESERVED = frozenset({"base", "none", "default", "latest", "versions", "names", "tmp"})


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
