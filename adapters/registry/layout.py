"""Where the registry keeps what (adapters.registry.registry describes the layout), and the checks
its JSON records pass before they are used."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from adapters.errors import RegistryCorrupt
from adapters.registry.names import DIGEST_RE

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
)  # and "variants", absent from meta written before it was recorded
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
    """The pointer read from folder/latest.json; RegistryCorrupt if it is not a valid one."""
    if value is None:
        return None
    if (
        not value.keys() >= set(POINTER_KEYS)
        or not all(isinstance(value[key], str) for key in POINTER_KEYS)
        or not DIGEST_RE.match(value["digest"])
        or value["name"] != folder.rpartition("/")[2]
        # A tenant's folder holds only that tenant's names: tenants/<owner>/names/<name>.
        or (folder.startswith("tenants/") and value["owner"] != folder.split("/")[1])
    ):
        raise RegistryCorrupt(f"registry {uri!r}: {folder}/{LATEST} is corrupted")
    return Pointer(**{key: value[key] for key in POINTER_KEYS}, folder=folder)


def checked_meta(value: dict | None, digest: str, uri: str) -> dict | None:
    """A version's meta.json; RegistryCorrupt if a field is missing or of the wrong type, or
    it names another digest."""
    if value is not None and not (value.keys() >= set(META_KEYS) and _meta_typed(value, digest)):
        raise RegistryCorrupt(f"registry {uri!r}: {version_dir(digest)}/{META} is corrupted")
    return value


def _meta_typed(meta: dict, digest: str) -> bool:
    """Whether every field of meta is of the type readers use it as."""
    modules, variants = meta["target_modules"], meta.get("variants", [])
    return (
        meta["digest"] == digest
        and _is_int(meta["rank"])
        and meta["rank"] > 0
        and all(_is_number(meta[key]) for key in ("alpha", "scale"))
        and isinstance(modules, list)
        and all(isinstance(module, str) for module in modules)
        and _is_int(meta["num_bytes"])
        and meta["num_bytes"] >= 0
        and isinstance(meta["has_draft"], bool)
        and isinstance(meta["created"], str)
        and isinstance(variants, list)
        and all(isinstance(variant, str) for variant in variants)
    )


def meta_variants(meta: dict) -> tuple[str, ...]:
    """The LoRA variants a version's meta records; () in meta written before they were."""
    return tuple(meta.get("variants", ()))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no count


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def iso_seconds(text: object) -> float | None:
    """Epoch seconds of an ISO 8601 time; None if it is not one."""
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None
