"""Staged adapters: an adapter whose files arrive one call at a time under an id, published
to its name once every file is there and the whole validates (Workers AI's finetunes).

Layout under the registry's root, beside the catalogue's (adapters.registry.registry):

    staged/<id>/record.json              {"id", "owner", "name", "base", "description",
                                          "public", "created", "modified", "published",
                                          "sizes": {file name: bytes received}}
    staged/<id>/files/<file name>        a file received, kept until the adapter is published
    tenants/<tenant>/staged/<name>.json  {"id"}: the tenant's staged adapter of that name

An id is a random UUID: it may name a public adapter to every tenant without revealing
anything of its owner. Who may use which id is the caller's rule, as for names. Staging
never touches the catalogue: publishing is the caller's, through Registry.publish, after
which mark_published drops the staged files (the published version holds them).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from dataclasses import dataclass

from adapters.registry.layout import now_iso
from adapters.registry.names import validate_name, validate_tenant
from adapters.registry.store import Store

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RECORD_KEYS = ("id", "owner", "name", "base", "description", "public", "created", "modified",
               "published", "sizes")  # fmt: skip


@dataclass(frozen=True)
class Staged:
    """A staged adapter: the name it publishes to, and whether it has been."""

    id: str
    owner: str
    name: str
    base: str  # the model it was made for, as its creator named it
    description: str
    public: bool  # to be made public when published
    created: str  # ISO 8601 UTC
    modified: str
    published: bool
    sizes: dict[str, int]  # the files held now (none once published): name -> bytes


class StagedAdapters:
    """Staged adapters in a registry's store; every call is blocking I/O."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def create(self, owner: str, name: str, base: str, description: str, public: bool) -> Staged:
        """A new, empty staged adapter for owner's name. It takes the name over from an
        earlier one of owner's, whose files are removed (the caller decides when it may)."""
        validate_name(name)
        validate_tenant(owner)
        now = now_iso()
        staged = Staged(str(uuid.uuid4()), owner, name, base, description, public, now, now,
                        published=False, sizes={})  # fmt: skip
        earlier = self.of_name(owner, name)
        self._write(staged)
        self._store.write_json(_name_file(owner, name), {"id": staged.id})
        if earlier is not None:
            self.drop(earlier)
        return staged

    def get(self, staged_id: str) -> Staged | None:
        """The staged adapter with this id, None if there is none (or the id is malformed)."""
        if not isinstance(staged_id, str) or not UUID_RE.fullmatch(staged_id):
            return None
        record = self._store.read_json(f"{_dir(staged_id)}/record.json")
        if record is None or any(k not in record for k in RECORD_KEYS):
            return None
        return Staged(**{k: record[k] for k in RECORD_KEYS})

    def of_name(self, owner: str, name: str) -> Staged | None:
        """owner's staged adapter of name, if any."""
        marker = self._store.read_json(_name_file(owner, name))
        staged = self.get(marker.get("id")) if marker else None
        return staged if staged is not None and staged.owner == owner else None

    def list(self, owner: str) -> list[Staged]:
        """owner's staged adapters, oldest first."""
        validate_tenant(owner)
        found = []
        for file_name in self._store.children(f"tenants/{owner}/staged"):
            name = file_name.removesuffix(".json")
            staged = self.of_name(owner, name) if file_name.endswith(".json") else None
            if staged is not None and staged.name == name:
                found.append(staged)
        return sorted(found, key=lambda s: (s.created, s.id))

    def files(self, staged_id: str) -> dict[str, bytes]:
        """The files received so far, by name."""
        folder = f"{_dir(staged_id)}/files"
        got = {name: self._store.read(f"{folder}/{name}") for name in self._store.children(folder)}
        return {name: data for name, data in got.items() if data is not None}

    def put_file(self, staged: Staged, file_name: str, data: bytes) -> Staged:
        """Keep one received file (replacing an earlier copy of it)."""
        self._store.write(f"{_dir(staged.id)}/files/{file_name}", data)
        return self._touch(staged, sizes={**staged.sizes, file_name: len(data)})

    def remove_file(self, staged: Staged, file_name: str) -> Staged:
        """Forget one received file."""
        self._store.remove(f"{_dir(staged.id)}/files/{file_name}")
        sizes = {k: v for k, v in staged.sizes.items() if k != file_name}
        return self._touch(staged, sizes=sizes)

    def mark_published(self, staged: Staged) -> Staged:
        """Record that staged's name now holds its adapter, and drop its files."""
        done = self._touch(staged, published=True, sizes={})
        self._store.remove(f"{_dir(staged.id)}/files")
        return done

    def drop(self, staged: Staged) -> None:
        """Remove staged and its files (and its name's marker, if the marker is still its)."""
        marker = _name_file(staged.owner, staged.name)
        if (self._store.read_json(marker) or {}).get("id") == staged.id:
            self._store.remove(marker)
        self._store.remove(_dir(staged.id))

    def _touch(self, staged: Staged, **changes) -> Staged:
        updated = dataclasses.replace(staged, modified=now_iso(), **changes)
        self._write(updated)
        return updated

    def _write(self, staged: Staged) -> None:
        self._store.write_json(f"{_dir(staged.id)}/record.json", dataclasses.asdict(staged))


def _dir(staged_id: str) -> str:
    return f"staged/{staged_id}"


def _name_file(owner: str, name: str) -> str:
    return f"tenants/{owner}/staged/{name}.json"
