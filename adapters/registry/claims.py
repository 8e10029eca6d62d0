"""Creating a name: a claim file, made exclusively, lets one of several concurrent creators win.

A creator takes tenants/<tenant>/names/<name>/claim before it writes the name's first
history entry and pointer; the claim stays as long as the name does. A creator that finds
the claim taken lost the race (NameConflict). A claim older than CLAIM_TTL_S whose name
still has no pointer was left by a creator that crashed: it is replaced. Two creators
replacing the same stale claim at once can, in a window of a few file operations, both
win; the later pointer then stands, as with any update.
"""

from __future__ import annotations

import time
import uuid

from adapters.errors import AdapterError, NameConflict, RegistryUnavailable
from adapters.registry.layout import CLAIM, CLAIM_TTL_S, LATEST, name_dir
from adapters.registry.store import Store


def take(store: Store, tenant: str, name: str) -> str:
    """Claim tenant's new name; returns the claim's token. NameConflict if another creator has it."""
    rel = f"{name_dir(tenant, name)}/{CLAIM}"
    token = uuid.uuid4().hex
    record = {"tenant": tenant, "name": name, "token": token, "created": time.time()}
    if store.create(rel, record):
        return token
    if is_stale(store, tenant, name, time.time()):
        store.remove(rel)
        if store.create(rel, record):
            return token
    raise NameConflict(
        f"adapter {name!r} is being created by another upload at the same time; "
        "retry to publish a new version of it"
    )


def release(store: Store, tenant: str, name: str, token: str) -> None:
    """Give up a claim after a failed create, unless the name exists or another creator holds it."""
    folder = name_dir(tenant, name)
    if store.exists(f"{folder}/{LATEST}") or _token(store, folder) != token:
        return
    store.remove(f"{folder}/{CLAIM}")


def is_stale(store: Store, tenant: str, name: str, now: float) -> bool:
    """Whether tenant's name has a claim but no pointer, and the claim is over CLAIM_TTL_S old."""
    folder = name_dir(tenant, name)
    if store.exists(f"{folder}/{LATEST}"):
        return False  # the name was created: the claim is its creator's, and stays
    created = claimed_at(store, folder)
    return created is not None and now - created > CLAIM_TTL_S


def claimed_at(store: Store, folder: str) -> float | None:
    """When the name folder's claim was taken: as it says, else by its file's time (a crash
    mid-write); None without a claim."""
    try:
        record = store.read_json(f"{folder}/{CLAIM}") or {}
    except RegistryUnavailable:
        raise
    except AdapterError:
        record = {}
    created = record.get("created")
    if isinstance(created, (int, float)):
        return float(created)
    return store.modified(f"{folder}/{CLAIM}")


def _token(store: Store, folder: str) -> str | None:
    try:
        record = store.read_json(f"{folder}/{CLAIM}") or {}
    except RegistryUnavailable:
        raise
    except AdapterError:
        return None
    return record.get("token")
