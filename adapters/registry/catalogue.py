"""The registry's read side: which pointer a (tenant, name) has, its history, versions' metadata,
the public index, and every pointer for a listing, in both the tenant and the legacy layout."""

from __future__ import annotations

import logging
from collections.abc import Callable

from adapters.errors import AdapterError, RegistryUnavailable, UnknownAdapter
from adapters.registry.layout import (
    HISTORY,
    LATEST,
    META,
    Pointer,
    checked_meta,
    checked_pointer,
    legacy_dir,
    name_dir,
    public_file,
    version_dir,
)
from adapters.registry.names import TENANT_RE
from adapters.registry.store import Store

log = logging.getLogger("loraserve.registry")

Skip = Callable[[str, Exception], None]  # told of a record a read passes over, and why


class Catalogue:
    """Reads of one registry's layout; a tenant's folder wins over a legacy name it owns."""

    def __init__(self, store: Store, skip: Skip | None = None) -> None:
        self.store = store
        self._skip = skip or _log_skip(store)

    def pointer(self, tenant: str, name: str) -> Pointer | None:
        """tenant's pointer for name: its own folder's, else a legacy one whose owner it is.
        RegistryCorrupt if tenant's own pointer is unreadable; an unreadable legacy one has
        no known owner and reads as absent, so it answers as any missing name does."""
        found = self.read_pointer(name_dir(tenant, name))
        if found is None:
            legacy = self._try(legacy_dir(name), self._skip)
            found = legacy if legacy is not None and legacy.owner == tenant else None
        return found

    def existing(self, tenant: str, name: str) -> Pointer:
        """pointer(), with UnknownAdapter when tenant has no such name."""
        pointer = self.pointer(tenant, name)
        if pointer is None:
            raise UnknownAdapter.for_name(name)
        return pointer

    def exists(self, tenant: str, name: str) -> bool:
        """Whether tenant has name: a pointer in its folder (readable or not), or a legacy one."""
        if self.store.exists(f"{name_dir(tenant, name)}/{LATEST}"):
            return True
        return self.legacy_owner(name) == tenant

    def read_pointer(self, folder: str) -> Pointer | None:
        """folder/latest.json, or None when there is none; AdapterError if it is corrupted."""
        value = self.store.read_json(f"{folder}/{LATEST}")
        return checked_pointer(value, folder, self.store.uri)

    def legacy_owner(self, name: str) -> str | None:
        """The owner in name's legacy pointer; None when absent or unreadable."""
        legacy = self._try(legacy_dir(name), self._skip)
        return legacy.owner if legacy else None

    def legacy_unreadable(self, name: str) -> bool:
        """Whether name's legacy pointer exists but cannot be read (its owner is unknown)."""
        try:
            self.read_pointer(legacy_dir(name))
        except RegistryUnavailable:
            raise
        except AdapterError:
            return True
        return False

    def folders(self, tenant: str, name: str) -> list[str]:
        """The folders that hold tenant's name: its own, and a legacy one it owns."""
        own = [name_dir(tenant, name)]
        return [*own, legacy_dir(name)] if self.legacy_owner(name) == tenant else own

    def history(self, tenant: str, name: str) -> set[str]:
        """Every digest tenant's name has pointed to, in either layout."""
        digests: set[str] = set()
        for folder in self.folders(tenant, name):
            digests.update(self.store.children(f"{folder}/{HISTORY}"))
        return digests

    def meta(self, digest: str) -> dict | None:
        """The version's meta.json, or None while it is absent or incomplete."""
        value = self.store.read_json(f"{version_dir(digest)}/{META}")
        return checked_meta(value, digest, self.store.uri)

    def listed_meta(self, pointer: Pointer, skip: Skip) -> dict | None:
        """The meta.json of pointer's version; None, told to skip, if missing or corrupted."""
        try:
            meta = self.meta(pointer.digest)
        except RegistryUnavailable:
            raise
        except AdapterError as exc:
            skip(pointer.folder, exc)
            return None
        if meta is None:
            skip(pointer.folder, AdapterError(f"it points to missing {pointer.digest}"))
        return meta

    def meta_or_none(self, digest: str) -> dict | None:
        """meta(), with a corrupted meta.json read as None (to be rewritten)."""
        try:
            return self.meta(digest)
        except RegistryUnavailable:
            raise
        except AdapterError:
            return None

    def indexed_owner(self, name: str) -> str | None:
        """The owner public/<name>.json names, whether or not that name still exists."""
        try:
            value = self.store.read_json(public_file(name))
        except RegistryUnavailable:
            raise
        except AdapterError as exc:
            # Unreadable: treat the name as private, the safe side.
            log.warning("registry %s: %s", self.store.uri, exc)
            return None
        owner = value.get("owner") if value else None
        # Checked: the owner becomes part of a path.
        return owner if isinstance(owner, str) and TENANT_RE.match(owner) else None

    def public_index(self) -> dict[str, str]:
        """name -> owner for every entry of the public index."""
        index = {}
        for file in self.store.children("public"):
            name = file.removesuffix(".json")
            owner = self.indexed_owner(name)
            if owner is not None:
                index[name] = owner
        return index

    def public_pointers(self, skip: Skip) -> list[Pointer]:
        """The pointer of every public adapter; corrupted ones go to skip."""
        found = []
        for name, owner in self.public_index().items():
            try:
                pointer = self.pointer(owner, name)
            except RegistryUnavailable:
                raise
            except AdapterError as exc:
                skip(name_dir(owner, name), exc)
                continue
            if pointer is not None:  # an entry of a deleted adapter counts as absent
                found.append(pointer)
        return found

    def pointers(self, owner: str | None, skip: Skip) -> list[Pointer]:
        """Every name's pointer (of owner, if given); corrupted ones go to skip."""
        # Legacy names are read first: a name moving to its tenant's folder meanwhile gets
        # its new pointer written before the legacy one goes, so the scan below sees it.
        found: dict[tuple[str, str], Pointer] = {}
        for name in self.store.children("names"):
            pointer = self._try(legacy_dir(name), skip)
            if pointer is not None and owner in (None, pointer.owner):
                found[(pointer.owner, name)] = pointer
        for tenant in [owner] if owner is not None else self.store.children("tenants"):
            for name in self.store.children(f"tenants/{tenant}/names"):
                pointer = self._try(name_dir(tenant, name), skip)
                if pointer is not None:
                    found[(tenant, name)] = pointer  # a tenant's folder wins over a legacy twin
        return list(found.values())

    def _try(self, folder: str, skip: Skip) -> Pointer | None:
        """The folder's pointer; None if it has none (mid create or delete) or is corrupted."""
        try:
            pointer = self.read_pointer(folder)
        except RegistryUnavailable:
            raise
        except AdapterError as exc:
            skip(folder, exc)
            return None
        return pointer


def _log_skip(store: Store) -> Skip:
    """A skip that only logs, for a catalogue without a registry counting its skips."""

    def skip(folder: str, reason: Exception) -> None:
        log.warning("registry %s: skipped %s: %s", store.uri, folder, reason)

    return skip
