"""A version's files under versions/<digest>: written, repaired, read back and parsed.

The files are the adapter's own bytes, so the digest names them and they never change.
meta.json is written after them and marks the version complete; a version whose files
went missing or were damaged is repaired by publishing the same content again.
"""

from __future__ import annotations

from adapters.errors import RegistryCorrupt, UnknownAdapter
from adapters.format.adapter import Adapter, parse_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.format.sources import CONFIG, WEIGHTS
from adapters.registry.catalogue import Catalogue
from adapters.registry.layout import DRAFT, META, now_iso, version_dir


def expected_files(adapter: Adapter) -> dict[str, bytes]:
    """Every file of adapter's version but meta.json, by its path in the registry."""
    folder = version_dir(adapter.digest)
    parts = [("", adapter)] + ([(DRAFT, adapter.draft)] if adapter.draft else [])
    files = {}
    for prefix, part in parts:
        files[f"{folder}/{prefix}{CONFIG}"] = part.config_bytes
        files[f"{folder}/{prefix}{WEIGHTS}"] = part.weights_bytes
    return files


def damaged(catalogue: Catalogue, adapter: Adapter) -> list[str]:
    """The paths of adapter's version whose stored bytes are missing or differ from adapter's."""
    store = catalogue.store
    return [rel for rel, data in expected_files(adapter).items() if store.read(rel) != data]


def is_intact(catalogue: Catalogue, adapter: Adapter) -> bool:
    """Whether adapter's version is complete and every file holds adapter's bytes."""
    return catalogue.meta_or_none(adapter.digest) is not None and not damaged(catalogue, adapter)


def store_version(catalogue: Catalogue, adapter: Adapter) -> dict:
    """Write the files of adapter's version that are missing or damaged, then meta.json if it
    is absent or corrupted; returns the version's meta."""
    store = catalogue.store
    expected = expected_files(adapter)
    for rel in damaged(catalogue, adapter):
        store.write(rel, expected[rel])
    meta = catalogue.meta_or_none(adapter.digest)
    if meta is None:
        meta = {
            "digest": adapter.digest,
            "rank": adapter.rank,
            "alpha": adapter.alpha,
            "scale": adapter.scale,
            "target_modules": list(adapter.target_modules),
            "num_bytes": adapter.num_bytes,
            "has_draft": adapter.draft is not None,
            "variants": list(adapter.variants),
            "created": now_iso(),
        }
        store.write_json(f"{version_dir(adapter.digest)}/{META}", meta)
    return meta


def read_files(catalogue: Catalogue, digest: str, prefix: str, label: str) -> dict[str, bytes]:
    """The config and weights of a stored version (prefix DRAFT: of its draft)."""
    files = {}
    for file in (CONFIG, WEIGHTS):
        data = catalogue.store.read(f"{version_dir(digest)}/{prefix}{file}")
        if data is None:
            raise RegistryCorrupt(f"adapter {label} is corrupted: {prefix}{file} is missing")
        files[file] = data
    return files


def load_version(
    catalogue: Catalogue,
    digest: str,
    label: str,
    *,
    base: BaseModelSpec | None,
    max_rank: int,
    verify: bool,
) -> Adapter:
    """The stored version digest, parsed (see Registry.load); label names it in messages."""
    meta = catalogue.meta(digest)
    if meta is None:
        if catalogue.store.exists(version_dir(digest)):
            raise UnknownAdapter(f"adapter {label} is incomplete and cannot be served")
        raise UnknownAdapter(f"unknown version {label}")
    short = f"{label.rpartition('@')[0] or 'version'}@{digest[:12]}"
    draft = None
    if meta["has_draft"]:
        draft_files = read_files(catalogue, digest, DRAFT, label)
        draft = parse_adapter(draft_files, max_rank=max_rank, label=f"{short} draft")
    files = read_files(catalogue, digest, "", label)
    trusted = None if verify else digest
    adapter = parse_adapter(
        files, base=base, max_rank=max_rank, draft=draft, label=short, stored_digest=trusted
    )
    if adapter.digest != digest:
        raise RegistryCorrupt(f"adapter {label} is corrupted: its files hash to {adapter.digest}")
    return adapter
