"""Where the registry keeps what (adapters.registry describes the layout), and the checks
its JSON records pass before they are used."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from adapters.errors import RegistryCorrupt
from adapters.names import DIGEST_RE

DRAFT = "draft_"  # file-name prefix of the draft companion's files
META = "meta.json"
LATEST = "latest.json"
HISTORY = "history"
CLAIM = "claim"
CLAIM_TTL_S = 60.0  # a claim without a pointer this old was left by a creator that crashed
META_KEYS = (
    "digest",
    "rank",
    "alpha",
    "scale",
    "target_modules",
    "num_bytes",
    "has_draft",
    "created",
)
POINTER_KEYS = ("name", "digest", "owner", "updated")


def version_dir(digest: str) -> str:
    return f"versions/{digest}"


def name_dir(tenant: str, name: str) -> str:
    return f"tenants/{tenant}/names/{name}"


def legacy_dir(name: str) -> str:
    """A name as registries before tenants kept it; its owner is in its pointer."""
    return f"names/{name}"


def public_file(name: str) -> str:
    return f"public/{name}.json"


def lease_file(holder: str) -> str:
    return f"leases/{holder}.json"


@dataclass(frozen=True)
class Pointer:
    """A name's latest.json, and the folder it was found in."""

    name: str
    digest: str
    owner: str
    updated: str
    folder: str  # name_dir(owner, name), or legacy_dir(name)

    @property
    def legacy(self) -> bool:
        return self.folder.startswith("names/")


def checked_pointer(value: dict | None, folder: str, uri: str) -> Pointer | None:
    """The pointer read from folder/latest.json; AdapterError if it is not a valid one."""
    if value is None:
        return None
    if (
        not value.keys() >= set(POINTER_KEYS)
        or not DIGEST_RE.match(str(value["digest"]))
        or value["name"] != folder.rpartition("/")[2]
        # A tenant's folder holds only that tenant's names: tenants/<owner>/names/<name>.
        or (folder.startswith("tenants/") and value["owner"] != folder.split("/")[1])
    ):
        raise RegistryCorrupt(f"registry {uri!r}: {folder}/{LATEST} is corrupted")
    fields = {key: str(value[key]) for key in POINTER_KEYS}
    return Pointer(**fields, folder=folder)


def checked_meta(value: dict | None, digest: str, uri: str) -> dict | None:
    """A version's meta.json; AdapterError if it lacks a field or names another digest."""
    if value is not None and (not value.keys() >= set(META_KEYS) or value["digest"] != digest):
        raise RegistryCorrupt(f"registry {uri!r}: {version_dir(digest)}/{META} is corrupted")
    return value


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def iso_seconds(text: object) -> float | None:
    """Epoch seconds of an ISO 8601 time; None if it is not one."""
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None
