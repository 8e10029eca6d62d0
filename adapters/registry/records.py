"""What the registry answers: a Version of a name, and an Entry of a name in the catalogue.

Both are made from what the registry stores (adapters.registry.layout): a version's
meta.json, checked before it gets here, and a name's pointer. Whether a name is public is
the public index's to say, so the caller passes it in.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.registry.layout import META_KEYS, Pointer, meta_variants
from adapters.registry.names import qualified


@dataclass(frozen=True)
class Version:
    """One complete, immutable version of a tenant's named adapter."""

    name: str
    digest: str  # sha256 hex of the adapter's content
    owner: str  # the tenant whose name this is
    rank: int
    alpha: float
    scale: float
    target_modules: tuple[str, ...]
    num_bytes: int
    has_draft: bool
    created: str  # ISO 8601 UTC time this content was first stored
    public: bool = False  # whether owner's name is the public adapter of that name
    variants: tuple[str, ...] = ()  # Adapter.variants; () if stored before they were recorded

    @property
    def ref(self) -> str:
        """The pinned reference a user sees, 'name@digest'."""
        return f"{self.name}@{self.digest}"

    @property
    def qualified(self) -> str:
        """The version's identity across tenants, 'owner/name@digest'."""
        return qualified(self.owner, self.name, self.digest)


@dataclass(frozen=True)
class Entry:
    """A tenant's name in the catalogue and the version it points to."""

    name: str
    digest: str
    owner: str
    updated: str  # ISO 8601 UTC time the name last moved
    rank: int
    target_modules: tuple[str, ...]
    num_bytes: int
    history: tuple[str, ...] = ()  # show() only: digests the name pointed to, newest first
    public: bool = False
    variants: tuple[str, ...] = ()  # as Version.variants


def version_record(name: str, owner: str, meta: dict, public: bool) -> Version:
    """owner's Version of name, from the version's meta.json."""
    fields = {key: meta[key] for key in META_KEYS}  # Version's fields besides name and owner
    fields["target_modules"] = tuple(fields["target_modules"])
    variants = meta_variants(meta)
    return Version(name=name, owner=owner, public=public, variants=variants, **fields)


def entry_record(pointer: Pointer, meta: dict, public: bool, history: tuple[str, ...]) -> Entry:
    """The Entry of pointer's name, from its version's meta.json."""
    return Entry(
        name=pointer.name,
        digest=pointer.digest,
        owner=pointer.owner,
        updated=pointer.updated,
        rank=meta["rank"],
        target_modules=tuple(meta["target_modules"]),
        num_bytes=meta["num_bytes"],
        history=history,
        public=public,
        variants=meta_variants(meta),
    )
