"""Publishing: storing a version and pointing a tenant's name at it, in the order that keeps
every reader consistent.

    1. a lease on the digest        (gc leaves a reused, unreferenced version alone)
    2. versions/<digest>/...        missing or damaged files, then meta.json
    3. the claim                    a new name only; losing it is NameConflict
    4. history/<digest>             (a legacy name: its history copied over first)
    5. latest.json                  the publish takes effect here
    6. the legacy folder removed    a legacy name only, pointer first

A failure before step 5 leaves the catalogue as it was: the history entries it added and
its claim are taken back, the rest is unreferenced and collected by gc, and a retry
completes it. (A crash instead can leave a history entry behind: 'name@digest' then
resolves to a complete version the name never pointed to.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from contextlib import suppress

from adapters.errors import AdapterError, NameConflict, RegistryUnavailable
from adapters.format.adapter import Adapter
from adapters.registry import claims, gc
from adapters.registry.catalogue import Catalogue
from adapters.registry.layout import HISTORY, LATEST, Pointer, legacy_dir, name_dir, now_iso
from adapters.registry.version_files import is_intact, store_version


def publish(
    catalogue: Catalogue, name: str, adapter: Adapter, owner: str, create_only: bool
) -> dict:
    """Point owner's name at adapter's version, stored first; returns the version's meta."""
    _check_publishable(adapter)
    found = _found(catalogue, owner, name)
    if found is not None and create_only:
        raise NameConflict(f"adapter {name!r} already exists")
    unchanged = found and not found.legacy and found.digest == adapter.digest
    if unchanged and is_intact(catalogue, adapter):
        return catalogue.meta(adapter.digest)
    store = catalogue.store
    holder = f"publish-{uuid.uuid4().hex}"
    gc.write_lease(store, holder, [adapter.digest])
    try:
        store_version(catalogue, adapter)
        if found is None:
            _create(catalogue, name, owner, adapter.digest)
        else:
            _move(catalogue, found, owner, adapter.digest)
        # A gc that read the leases before this one existed may have removed a reused version.
        return catalogue.meta_or_none(adapter.digest) or store_version(catalogue, adapter)
    finally:
        with suppress(RegistryUnavailable):  # a lease left behind only expires later
            gc.drop_lease(store, holder)


def _found(catalogue: Catalogue, owner: str, name: str) -> Pointer | None:
    """owner's pointer for name; an unreadable one in owner's own folder is read as a name
    that exists but points nowhere, so that publishing to it repairs it."""
    try:
        return catalogue.pointer(owner, name)
    except RegistryUnavailable:
        raise
    except AdapterError:
        folder = name_dir(owner, name)
        if not catalogue.store.exists(f"{folder}/{LATEST}"):
            return None  # an unreadable legacy pointer has no known owner: create anew
        return Pointer(name=name, digest="", owner=owner, updated="", folder=folder)


def _create(catalogue: Catalogue, name: str, owner: str, digest: str) -> None:
    """Take the new name's claim, then write its first history entry and pointer."""
    token = claims.take(catalogue.store, owner, name)
    try:
        _point(catalogue, name, owner, digest, ())
    except BaseException:
        with suppress(AdapterError):
            claims.release(catalogue.store, owner, name, token)
        raise


def _move(catalogue: Catalogue, found: Pointer, owner: str, digest: str) -> None:
    """Point an existing name at digest, moving it out of the legacy layout if it is there."""
    store = catalogue.store
    copied = store.children(f"{found.folder}/{HISTORY}") if found.legacy else ()
    _point(catalogue, found.name, owner, digest, copied)
    if found.legacy:
        store.remove(f"{legacy_dir(found.name)}/{LATEST}")
        store.remove(legacy_dir(found.name))


def _point(catalogue: Catalogue, name: str, owner: str, digest: str, copied: Iterable[str]):
    """Write the history entries, then the pointer; a failure takes back the new entries."""
    store, folder = catalogue.store, name_dir(owner, name)
    added = []
    try:
        # The history entries come before the pointer, so a pointer's digest is always in it.
        for entry in (*copied, digest):
            rel = f"{folder}/{HISTORY}/{entry}"
            if not store.exists(rel):
                store.write(rel, b"")
                added.append(rel)
        pointer = {"name": name, "digest": digest, "owner": owner, "updated": now_iso()}
        store.write_json(f"{folder}/{LATEST}", pointer)
    except BaseException:
        # Otherwise 'name@digest' would resolve to a version the name never pointed to.
        with suppress(AdapterError):
            for rel in added:
                store.remove(rel)
        raise


def _check_publishable(adapter: object) -> None:
    if not isinstance(adapter, Adapter):
        raise AdapterError(f"cannot publish {type(adapter).__name__}: expected an Adapter")
    if adapter.draft is not None and adapter.draft.draft is not None:
        raise AdapterError("a draft adapter cannot have a draft of its own")
