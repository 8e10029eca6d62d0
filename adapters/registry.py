"""The adapter registry: a durable catalogue of named, content-addressed adapter versions.

Layout under the registry's root, any fsspec URL (file://, memory://, s3://) or a folder:

    versions/<digest>/adapter_config.json, adapter_model.safetensors
                      draft_adapter_config.json, draft_adapter_model.safetensors  (with a draft)
                      meta.json                  written last: without it a version is incomplete
    names/<name>/history/<digest>                empty; one per digest the name has pointed to
    names/<name>/latest.json                     {"name", "digest", "owner", "updated"}, last

Each file is written whole (adapters.store) and before the file that makes it reachable,
so a crash or a concurrent publisher leaves at worst unreferenced files, never a pointer to
half a version. History entries are separate files, never a list rewritten, so concurrent
publishers cannot lose each other's entries.

Versions are immutable and delete() never removes them: a replica may have loaded one and
keep serving it. Collecting unreferenced versions is out of scope here. The owner check
reads, then writes; without compare-and-swap on every filesystem, two owners racing to
create the same new name can both succeed, the later pointer winning.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from adapters.base_model import BaseModelSpec
from adapters.errors import AdapterError
from adapters.format import Adapter, parse_adapter
from adapters.names import DIGEST_RE, parse_ref, validate_name
from adapters.sources import CONFIG, WEIGHTS
from adapters.store import Store

DRAFT = "draft_"  # file-name prefix of the draft companion's files
META = "meta.json"
LATEST = "latest.json"
_META_KEYS = (
    "digest",
    "rank",
    "alpha",
    "scale",
    "target_modules",
    "num_bytes",
    "has_draft",
    "created",
)
_POINTER_KEYS = ("name", "digest", "owner", "updated")


@dataclass(frozen=True)
class Version:
    """One complete, immutable version of a named adapter."""

    name: str
    digest: str  # sha256 hex of the adapter's content
    owner: str  # the name's owner
    rank: int
    alpha: float
    scale: float
    target_modules: tuple[str, ...]
    num_bytes: int
    has_draft: bool
    created: str  # ISO 8601 UTC time this content was first stored

    @property
    def ref(self) -> str:
        """The pinned reference, 'name@digest'."""
        return f"{self.name}@{self.digest}"


@dataclass(frozen=True)
class Entry:
    """A name in the catalogue and the version it points to."""

    name: str
    digest: str
    owner: str
    updated: str  # ISO 8601 UTC time the name last moved
    rank: int
    target_modules: tuple[str, ...]
    num_bytes: int
    history: tuple[str, ...] = ()  # show() only: digests the name pointed to, newest first


class Registry:
    """Named adapter versions under one fsspec URL, safe for concurrent publishers."""

    def __init__(self, uri: str, **storage_options) -> None:
        self._store = Store(uri, **storage_options)
        self.uri = uri

    def publish(
        self, name: str, adapter: Adapter, owner: str = "default", *, replace_owner: bool = False
    ) -> Version:
        """Store adapter's version and point name at it; a no-op if it already does."""
        validate_name(name)
        _check_owner(owner)
        _check_publishable(adapter)
        pointer = self._pointer(name)
        if pointer and pointer["owner"] != owner and not replace_owner:
            raise AdapterError(
                f"adapter {name!r} belongs to owner {pointer['owner']!r}; "
                f"{owner!r} cannot publish to it"
            )
        meta = self._meta(adapter.digest)
        if meta and pointer and (pointer["digest"], pointer["owner"]) == (adapter.digest, owner):
            return _version(name, owner, meta)
        meta = meta or self._store_version(adapter)
        # The history entry comes before the pointer, so a pointer's digest is always in it.
        self._store.write(f"names/{name}/history/{adapter.digest}", b"")
        self._store.write_json(
            f"names/{name}/{LATEST}",
            {"name": name, "digest": adapter.digest, "owner": owner, "updated": _now()},
        )
        return _version(name, owner, meta)

    def resolve(self, ref: str) -> Version:
        """'name' -> its latest version; 'name@digest' -> that version of the name."""
        if not isinstance(ref, str):
            raise AdapterError(f"invalid adapter reference {ref!r}: expected 'name[@digest]'")
        name, digest = parse_ref(ref)
        pointer = self._existing_pointer(name)
        digest = digest or pointer["digest"]
        # The latest digest is accepted even without its history entry: a delete racing a
        # publish can remove the entry after the new pointer's publisher wrote it.
        known = digest == pointer["digest"] or self._store.exists(f"names/{name}/history/{digest}")
        if not known:
            raise AdapterError(f"unknown version {digest} of adapter {name!r}")
        meta = self._meta(digest)
        if meta is None:
            raise AdapterError(f"adapter {name}@{digest} is incomplete and cannot be served")
        return _version(name, pointer["owner"], meta)

    def load(
        self,
        ref: str,
        *,
        base: BaseModelSpec | None = None,
        max_rank: int = 64,
        verify: bool = True,
    ) -> Adapter:
        """The Adapter that ref resolves to.

        verify=True re-validates it whole and checks its files hash to the stored digest;
        verify=False (a replica's hot path) trusts what publish validated, re-checking only
        the structure, shapes and safetensors header, never the values or the hash.
        """
        version = self.resolve(ref)
        label = f"{version.name}@{version.digest[:12]}"
        draft = None
        if version.has_draft:
            draft_files = self._version_files(version, DRAFT)
            draft = parse_adapter(draft_files, max_rank=max_rank, label=f"{label} draft")
        files = self._version_files(version, "")
        trusted = None if verify else version.digest
        adapter = parse_adapter(
            files, base=base, max_rank=max_rank, draft=draft, label=label, stored_digest=trusted
        )
        if adapter.digest != version.digest:
            raise AdapterError(
                f"adapter {version.ref} is corrupted: its files hash to {adapter.digest}"
            )
        return adapter

    def exists(self, name: str) -> bool:
        """Whether name is currently published."""
        validate_name(name)
        return self._store.exists(f"names/{name}/{LATEST}")

    def list(self, owner: str | None = None) -> list[Entry]:
        """Every published name (of owner, if given), sorted by name."""
        entries = []
        for name in self._store.children("names"):
            pointer = self._pointer(name)
            # A folder without a pointer is a name being created or deleted right now.
            if pointer and (owner is None or pointer["owner"] == owner):
                entries.append(self._entry(pointer, ()))
        return entries

    def show(self, name: str) -> Entry:
        """name's entry with its history: every digest it pointed to, newest version first."""
        validate_name(name)
        pointer = self._existing_pointer(name)
        digests = self._store.children(f"names/{name}/history")
        created = {d: (self._meta(d) or {}).get("created", "") for d in digests}
        history = sorted(digests, key=lambda d: (created[d], d), reverse=True)
        return self._entry(pointer, tuple(history))

    def delete(self, name: str) -> None:
        """Remove name's pointer and history; its versions stay, as versions are immutable."""
        # exists() rather than reading the pointer, so a corrupted name can still be deleted.
        if not self.exists(name):
            raise AdapterError(f"unknown adapter {name!r}")
        # The pointer goes first: from then on the name is gone even if removing the rest fails.
        self._store.remove(f"names/{name}/{LATEST}")
        self._store.remove(f"names/{name}")

    def _store_version(self, adapter: Adapter) -> dict:
        """Write adapter's files, then meta.json, which marks the version complete."""
        folder = f"versions/{adapter.digest}"
        parts = [("", adapter)] + ([(DRAFT, adapter.draft)] if adapter.draft else [])
        for prefix, part in parts:
            self._store.write(f"{folder}/{prefix}{CONFIG}", part.config_bytes)
            self._store.write(f"{folder}/{prefix}{WEIGHTS}", part.weights_bytes)
        meta = {
            "digest": adapter.digest,
            "rank": adapter.rank,
            "alpha": adapter.alpha,
            "scale": adapter.scale,
            "target_modules": list(adapter.target_modules),
            "num_bytes": adapter.num_bytes,
            "has_draft": adapter.draft is not None,
            "created": _now(),
        }
        self._store.write_json(f"{folder}/{META}", meta)
        return meta

    def _version_files(self, version: Version, prefix: str) -> dict[str, bytes]:
        files = {}
        for file in (CONFIG, WEIGHTS):
            data = self._store.read(f"versions/{version.digest}/{prefix}{file}")
            if data is None:
                raise AdapterError(f"adapter {version.ref} is corrupted: {prefix}{file} is missing")
            files[file] = data
        return files

    def _meta(self, digest: str) -> dict | None:
        """The version's meta.json, or None while the version is absent or incomplete."""
        meta = self._store.read_json(f"versions/{digest}/{META}")
        if meta is not None and (not meta.keys() >= set(_META_KEYS) or meta["digest"] != digest):
            raise AdapterError(f"registry {self.uri!r}: versions/{digest}/{META} is corrupted")
        return meta

    def _pointer(self, name: str) -> dict | None:
        """names/<name>/latest.json, or None when name is not published."""
        pointer = self._store.read_json(f"names/{name}/{LATEST}")
        if pointer is not None and (
            not pointer.keys() >= set(_POINTER_KEYS) or not DIGEST_RE.match(str(pointer["digest"]))
        ):
            raise AdapterError(f"registry {self.uri!r}: names/{name}/{LATEST} is corrupted")
        return pointer

    def _existing_pointer(self, name: str) -> dict:
        pointer = self._pointer(name)
        if pointer is None:
            raise AdapterError(f"unknown adapter {name!r}")
        return pointer

    def _entry(self, pointer: dict, history: tuple[str, ...]) -> Entry:
        meta = self._meta(pointer["digest"])
        if meta is None:  # the pointer is written only after meta.json
            raise AdapterError(f"adapter {pointer['name']!r} points to a missing version")
        return Entry(
            **{key: pointer[key] for key in _POINTER_KEYS},
            rank=meta["rank"],
            target_modules=tuple(meta["target_modules"]),
            num_bytes=meta["num_bytes"],
            history=history,
        )


def _version(name: str, owner: str, meta: dict) -> Version:
    fields = {key: meta[key] for key in _META_KEYS}  # Version's fields besides name and owner
    fields["target_modules"] = tuple(fields["target_modules"])
    return Version(name=name, owner=owner, **fields)


def _check_owner(owner: object) -> None:
    if not isinstance(owner, str) or not owner.strip():
        raise AdapterError(f"invalid owner {owner!r}: a non-empty string is required")


def _check_publishable(adapter: object) -> None:
    if not isinstance(adapter, Adapter):
        raise AdapterError(f"cannot publish {type(adapter).__name__}: expected an Adapter")
    if adapter.draft is not None and adapter.draft.draft is not None:
        raise AdapterError("a draft adapter cannot have a draft of its own")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
