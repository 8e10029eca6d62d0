"""The adapter registry: a durable catalogue of content-addressed adapter versions, named per tenant.

Layout under the registry's root, any fsspec URL (file://, memory://, s3://) or a folder:

    versions/<digest>/adapter_config.json, adapter_model.safetensors
                      draft_adapter_config.json, draft_adapter_model.safetensors  (with a draft)
                      meta.json                  written last: without it a version is incomplete
    tenants/<tenant>/names/<name>/claim          made exclusively when the name is created
    tenants/<tenant>/names/<name>/history/<digest>   empty; one per digest the name pointed to
    tenants/<tenant>/names/<name>/latest.json    {"name", "digest", "owner", "updated"}, last
    public/<name>.json                           {"name", "owner"}: the one public adapter <name>
    leases/<holder>.json                         {"holder", "digests", "updated"}: in use
    names/<name>/latest.json, names/<name>/history/<digest>     the legacy layout

Names are per tenant: two tenants may each own "support-bot". Registries written before
tenants keep every name under names/<name>, its tenant being its pointer's owner. They
are read in place: (tenant, name) is looked up in the tenant's folder first, then in
names/<name> if that pointer's owner is the tenant (an unreadable one, whose owner is
unknown, reads as absent); a listing shows a legacy name unless its tenant's folder has a
pointer too. Publishing to a legacy name moves it (history copied, then the pointer, then
the legacy folder removed); delete removes both.

Each file is written whole and durably (adapters.registry.store) before the file that makes it
reachable, so a crash or a concurrent publisher leaves at worst unreferenced files, never
a pointer to half a version. History entries are separate files, never a list rewritten,
so concurrent publishers cannot lose each other's entries. Concurrent creators of one new
name race for its claim (adapters.registry.claims): one wins, the others get NameConflict.

Versions are immutable and delete() never removes them: a replica may have loaded one and
keep serving it, by its digest alone. gc() collects versions nothing refers to or leases
(adapters.registry.gc). Who may see or change what is decided in adapters.registry.visibility.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from adapters.errors import AdapterError, UnknownAdapter
from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec
from adapters.registry import gc, public_index, publishing
from adapters.registry.catalogue import Catalogue, log
from adapters.registry.layout import LATEST, Pointer, legacy_dir
from adapters.registry.names import (
    DIGEST_RE,
    parse_ref,
    parse_version,
    validate_name,
    validate_tenant,
)
from adapters.registry.records import Entry, Version, entry_record, version_record
from adapters.registry.staged import StagedAdapters
from adapters.registry.store import Store
from adapters.registry.version_files import load_version


class Registry:
    """Named adapter versions under one fsspec URL, safe for concurrent publishers.

    `skipped` counts the entries listings have left out, and the unreadable legacy pointers
    lookups have read as absent, because they were corrupted or half-written (each also
    logged on "loraserve.registry"); it only grows.
    """

    def __init__(self, uri: str, *, create: bool = True, **storage_options) -> None:
        """The registry at uri, made if absent; create=False: RegistryUnavailable instead."""
        self.uri = uri
        self.skipped = 0
        self._skipped_lock = threading.Lock()
        self._store = Store(uri, create=create, **storage_options)
        self._cat = Catalogue(self._store, self._skip)
        self.staged = StagedAdapters(self._store)  # adapters uploaded a file at a time

    def publish(
        self, name: str, adapter: Adapter, owner: str = "default", *, create_only: bool = False
    ) -> Version:
        """Store adapter's version and point owner's name at it; a no-op if it already does
        and the stored files are intact. NameConflict if create_only and the name exists, or
        if a concurrent upload is creating the name."""
        validate_name(name)
        validate_tenant(owner)
        meta = publishing.publish(self._cat, name, adapter, owner, create_only)
        return self._version(name, owner, meta)

    def resolve(self, ref: str, owner: str = "default") -> Version:
        """'name' -> owner's latest version of it; 'name@digest' -> that version of the name."""
        if not isinstance(ref, str):
            raise AdapterError(f"invalid adapter reference {ref!r}: expected 'name[@digest]'")
        name, digest = parse_ref(ref)
        validate_tenant(owner)
        pointer = self._cat.existing(owner, name)
        digest = digest or pointer.digest
        # The latest digest is accepted even without its history entry: a delete racing a
        # publish can remove the entry after the new pointer's publisher wrote it.
        if digest != pointer.digest and digest not in self._cat.history(owner, name):
            raise UnknownAdapter.for_version(name, digest)
        meta = self._cat.meta(digest)
        if meta is None:
            raise UnknownAdapter(f"adapter {name}@{digest} is incomplete and cannot be served")
        return self._version(name, owner, meta)

    def load(
        self,
        version: str,
        *,
        base: BaseModelSpec | None = None,
        max_rank: int = 64,
        verify: bool = True,
    ) -> Adapter:
        """The Adapter of a version: 'tenant/name@digest', 'name@digest' or a bare digest is
        read by its digest alone (versions are immutable; its name may be gone meanwhile);
        any other string is a name of the default tenant, resolved to its latest version.

        verify=True re-validates it whole and checks its files hash to the stored digest;
        verify=False (a replica's hot path) trusts what publish validated, re-checking only
        the structure, shapes and safetensors header, never the values or the hash.
        """
        if not isinstance(version, str):
            raise AdapterError(f"invalid adapter version {version!r}: expected 'name@digest'")
        if "@" not in version and not DIGEST_RE.match(version):
            version = self.resolve(version).ref
        _, _, digest = parse_version(version)
        return load_version(self._cat, digest, version, base=base, max_rank=max_rank, verify=verify)

    def exists(self, name: str, owner: str = "default") -> bool:
        """Whether owner currently has a name called name."""
        validate_name(name)
        validate_tenant(owner)
        return self._cat.exists(owner, name)

    def list(self, owner: str | None = None) -> list[Entry]:
        """Every name (of owner, if given), sorted by (name, owner); corrupted entries are
        left out, logged and counted in `skipped`."""
        if owner is not None:
            validate_tenant(owner)
        public = self._cat.public_index()
        entries = []
        for pointer in self._cat.pointers(owner, self._skip):
            entry = self._entry_or_skip(pointer, public.get(pointer.name) == pointer.owner)
            if entry is not None:
                entries.append(entry)
        return sorted(entries, key=lambda e: (e.name, e.owner))

    def list_visible(self, tenant: str) -> list[Entry]:
        """tenant's own names and every other tenant's public one whose name tenant has not
        (its own wins, as in resolving), sorted by (name, owner)."""
        entries = self.list(tenant)
        for pointer in self._cat.public_pointers(self._skip):
            # exists(), as resolving asks it: an own name left out as corrupted still wins.
            if pointer.owner == tenant or self._cat.exists(tenant, pointer.name):
                continue
            if entry := self._entry_or_skip(pointer, True):
                entries.append(entry)
        return sorted(entries, key=lambda e: (e.name, e.owner))

    def show(self, name: str, owner: str = "default") -> Entry:
        """owner's name with its history: every digest it pointed to, newest version first."""
        validate_name(name)
        validate_tenant(owner)
        pointer = self._cat.existing(owner, name)
        digests = self._cat.history(owner, name)
        created = {d: (self._cat.meta_or_none(d) or {}).get("created", "") for d in digests}
        history = sorted(digests, key=lambda d: (created[d], d), reverse=True)
        meta = self._cat.meta(pointer.digest)
        if meta is None:  # the pointer is written only after meta.json
            raise UnknownAdapter(f"adapter {name!r} points to a missing version")
        return entry_record(pointer, meta, self._cat.indexed_owner(name) == owner, tuple(history))

    def delete(self, name: str, owner: str = "default") -> None:
        """Remove owner's name: its public index entry, pointer and history, in both layouts;
        its versions stay, as versions are immutable. A legacy name whose pointer is
        unreadable has no known owner: an owner with no name of its own by it removes it."""
        # exists() rather than reading the pointer, so a corrupted name can still be deleted.
        if self.exists(name, owner):
            # The index entry goes first: a crash must not leave a later name of owner public.
            public_index.unlist(self._cat, name, owner)
            folders = self._cat.folders(owner, name)
        elif self._cat.legacy_unreadable(name):
            # Nobody can use it, and its owner cannot be checked: an operator's repair.
            folders = [legacy_dir(name)]
        else:
            raise UnknownAdapter.for_name(name)
        # Pointers first: from then on the name is gone even if removing the rest fails.
        for folder in folders:
            self._store.remove(f"{folder}/{LATEST}")
        for folder in folders:
            self._store.remove(folder)

    def set_public(self, name: str, owner: str, public: bool) -> Entry:
        """Make owner's name the public adapter of that name (every tenant may use it), or
        private again. NameConflict if another tenant's adapter of that name is public."""
        validate_name(name)
        validate_tenant(owner)
        public_index.set_public(self._cat, name, owner, public)
        return self.show(name, owner)

    def public_owner(self, name: str) -> str | None:
        """The tenant whose adapter called name is public, if any."""
        validate_name(name)
        return public_index.public_owner(self._cat, name)

    def public_names(self) -> dict[str, str]:
        """name -> owner of every public adapter."""
        return self._cat.public_index()

    def write_lease(self, holder: str, digests: Iterable[str]) -> None:
        """Record that holder (a replica) uses these versions; gc keeps them while it is fresh.
        Digests or version strings ('tenant/name@digest') are both accepted."""
        gc.write_lease(self._store, holder, digests)

    def drop_lease(self, holder: str) -> None:
        """Forget holder's lease."""
        gc.drop_lease(self._store, holder)

    def gc(
        self,
        *,
        grace_s: float = 86400,
        lease_ttl_s: float = 600,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[str]:
        """Remove versions no name refers to, no fresh lease lists and older than grace_s,
        with debris of crashed creates and stale leases (adapters.registry.gc); returns the versions'
        digests (those that would go, with dry_run, which removes nothing)."""
        return gc.collect(
            self._cat, grace_s=grace_s, lease_ttl_s=lease_ttl_s, dry_run=dry_run, now=now
        )

    def _version(self, name: str, owner: str, meta: dict) -> Version:
        return version_record(name, owner, meta, public=self._cat.indexed_owner(name) == owner)

    def _entry_or_skip(self, pointer: Pointer, public: bool) -> Entry | None:
        """pointer's entry; None, counted as skipped, when its version is missing or corrupted."""
        meta = self._cat.listed_meta(pointer, self._skip)
        return None if meta is None else entry_record(pointer, meta, public, ())

    def _skip(self, folder: str, reason: Exception) -> None:
        log.warning("registry %s: skipped %s: %s", self.uri, folder, reason)
        with self._skipped_lock:
            self.skipped += 1
