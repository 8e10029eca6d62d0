"""Collecting versions nothing uses any more, and the leases that say what replicas use.

A version is removed when all of these hold:
  - no pointer and no history entry of any name, in either layout, refers to it;
  - no lease updated within lease_ttl_s lists it (replicas lease what they serve, and a
    publish leases the version it is about to point at);
  - it is older than grace_s: by meta.json's "created", or for an incomplete version by
    its newest file's time (kept when the filesystem reports none).
Name folders without a pointer whose claim (or, without one, newest file) is older than
CLAIM_TTL_S are debris of a crashed create or delete and go first; leases older than
lease_ttl_s go too. References and leases are read again just before removing, and
meta.json goes before the rest, so a version being removed reads as incomplete, never as
half a version. A publish that runs whole between that last read and the removal can
still point at a removed version; publishing the same content again repairs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from adapters.errors import AdapterError, RegistryUnavailable
from adapters.registry.catalogue import Catalogue, log
from adapters.registry.claims import claimed_at
from adapters.registry.layout import (
    CLAIM_TTL_S,
    HISTORY,
    LATEST,
    META,
    iso_seconds,
    lease_file,
    version_dir,
)
from adapters.registry.names import DIGEST_RE, TENANT_RE, version_digest
from adapters.registry.store import Store


def write_lease(store: Store, holder: str, versions: Iterable[str]) -> None:
    """Record that holder uses these versions (digests or 'tenant/name@digest'), now."""
    _check_holder(holder)
    digests = sorted({version_digest(v) for v in versions})
    bad = [d for d in digests if not DIGEST_RE.match(d)]
    if bad:
        raise AdapterError(f"lease {holder!r}: {bad[0]!r} is not a version digest")
    record = {"holder": holder, "digests": digests, "updated": time.time()}
    store.write_json(lease_file(holder), record)


def drop_lease(store: Store, holder: str) -> None:
    """Forget holder's lease; absent is fine."""
    _check_holder(holder)
    store.remove(lease_file(holder))


def collect(
    catalogue: Catalogue, *, grace_s: float, lease_ttl_s: float, dry_run: bool, now: float | None
) -> list[str]:
    """Remove the versions nothing uses (see the module docstring); returns their digests."""
    store = catalogue.store
    now = time.time() if now is None else now
    debris = [f for f in _name_folders(store) if _is_debris(store, f, now)]
    # Leases before references: a publish leases a version before it refers to it.
    leased, stale_leases = _leases(store, now, lease_ttl_s)
    used = leased | _referenced(catalogue, set(debris))
    candidates = [
        d
        for d in store.children("versions")
        if DIGEST_RE.match(d) and d not in used and _older(catalogue, d, now, grace_s)
    ]
    if dry_run:
        return candidates
    for rel in debris + stale_leases:
        store.remove(rel)
    used = _leases(store, now, lease_ttl_s)[0] | _referenced(catalogue, set())
    removed = []
    for digest in candidates:
        if digest not in used:
            store.remove(f"{version_dir(digest)}/{META}")
            store.remove(version_dir(digest))
            removed.append(digest)
    return removed


def _name_folders(store: Store) -> list[str]:
    """Every name folder: each tenant's, then the legacy ones."""
    folders = [
        f"tenants/{tenant}/names/{name}"
        for tenant in store.children("tenants")
        for name in store.children(f"tenants/{tenant}/names")
    ]
    return folders + [f"names/{name}" for name in store.children("names")]


def _is_debris(store: Store, folder: str, now: float) -> bool:
    """A folder without a pointer, left long enough ago by a create or a delete."""
    if store.exists(f"{folder}/{LATEST}"):
        return False
    since = claimed_at(store, folder)
    since = store.modified(folder) if since is None else since
    return since is not None and now - since > CLAIM_TTL_S


def _referenced(catalogue: Catalogue, skip: set[str]) -> set[str]:
    """Digests a pointer or a history entry of a name folder not in skip refers to."""
    store = catalogue.store
    digests: set[str] = set()
    for folder in _name_folders(store):
        if folder in skip:
            continue
        digests.update(store.children(f"{folder}/{HISTORY}"))
        try:
            pointer = catalogue.read_pointer(folder)
        except RegistryUnavailable:
            raise
        except AdapterError:
            continue  # its digest has a history entry, written before any pointer
        if pointer is not None:
            digests.add(pointer.digest)
    return digests


def _leases(store: Store, now: float, ttl_s: float) -> tuple[set[str], list[str]]:
    """(digests fresh leases list, paths of leases older than ttl_s)."""
    fresh: set[str] = set()
    stale = []
    for file in store.children("leases"):
        rel = f"leases/{file}"
        try:
            record = store.read_json(rel) or {}
        except RegistryUnavailable:
            raise
        except AdapterError as exc:
            log.warning("registry %s: %s", store.uri, exc)
            record = {}
        updated = record.get("updated")
        if not isinstance(updated, (int, float)):
            updated = store.modified(rel)
        if updated is not None and now - updated > ttl_s:
            stale.append(rel)
        else:
            fresh.update(d for d in record.get("digests", ()) if isinstance(d, str))
    return fresh, stale


def _older(catalogue: Catalogue, digest: str, now: float, grace_s: float) -> bool:
    """Whether the version was stored over grace_s ago; False when that cannot be told."""
    meta = catalogue.meta_or_none(digest)
    created = iso_seconds(meta["created"]) if meta else None
    if created is None:
        created = catalogue.store.modified(version_dir(digest))
    return created is not None and now - created > grace_s


def _check_holder(holder: object) -> None:
    if not isinstance(holder, str) or not TENANT_RE.match(holder):
        raise AdapterError(
            f"invalid lease holder {str(holder)[:80]!r}: use 1-64 characters of A-Z, a-z, 0-9, "
            "'.', '_' or '-', starting with a letter or digit"
        )
