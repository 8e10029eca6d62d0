"""The JSON of an adapter version and of a catalogue entry, as the adapter routes answer."""

from __future__ import annotations

from adapters.registry.records import Entry, Version


def version_json(v: Version) -> dict:
    """An uploaded version; `version` is the pinned reference `name@digest`."""
    return {
        "object": "adapter",
        "name": v.name,
        "version": v.ref,
        "digest": v.digest,
        "owner": v.owner,
        "public": v.public,
        "rank": v.rank,
        "alpha": v.alpha,
        "scale": v.scale,
        "target_modules": list(v.target_modules),
        "num_bytes": v.num_bytes,
        "has_draft": v.has_draft,
        "variants": list(v.variants),
        "created": v.created,
    }


def entry_json(e: Entry) -> dict:
    """A name in the catalogue and the version it points to."""
    return {
        "object": "adapter",
        "name": e.name,
        "version": f"{e.name}@{e.digest}",
        "digest": e.digest,
        "owner": e.owner,
        "public": e.public,
        "rank": e.rank,
        "target_modules": list(e.target_modules),
        "num_bytes": e.num_bytes,
        "variants": list(e.variants),
        "updated": e.updated,
    }
