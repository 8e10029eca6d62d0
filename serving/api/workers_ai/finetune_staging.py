"""The blocking steps of a finetune's life (Workers AI's finetunes, kept as staged adapters,
adapters.registry.staged): create one, take a file, publish the whole, list them, and find
one by id for a request. Routes run them in worker threads.

A step that changes a finetune holds its tenant's lock (serving.api.core.quotas), re-reads
the finetune under it, and publishes within it, so a retry or a create racing it acts on
what is stored now. Across API processes (replicas) the lock does not reach: each file is
stored first and the files are then listed again, so two replicas bringing the two files
at once still publish, and a publish found done already (the same digest under the name)
is taken as done.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from adapters.errors import AdapterError, NameConflict, UnknownAdapter, quoted
from adapters.format.adapter import pickle_refused
from adapters.format.peft_config import parse_config
from adapters.format.safetensors_check import check_header
from adapters.format.sources import CONFIG, PICKLE_WEIGHTS, WEIGHTS
from adapters.registry.layout import iso_seconds
from adapters.registry.records import Version
from adapters.registry.registry import Registry
from adapters.registry.staged import Staged
from adapters.registry.visibility import visible_staged
from serving.api.core.adapter_upload import publish_upload, validate_upload
from serving.api.core.errors import ApiError
from serving.api.core.quotas import check_staged_bytes, check_unfinished, holdings, tenant_lock
from serving.api.core.settings import AppSettings

ASSETS = (CONFIG, WEIGHTS)
UNFINISHED_TTL_S = 24 * 3600  # an unfinished finetune untouched this long is dropped
Limits = Mapping[str, int | None]


def create(
    registry: Registry, owner: str, name: str, base: str, description: str, public: bool,
    limits: Limits,
) -> Staged:  # fmt: skip
    """A new, empty finetune for owner's name (replacing an unfinished one of that name)."""
    with tenant_lock(owner):
        if registry.exists(name, owner):
            raise NameConflict(
                f"this account already has an adapter named {name!r}: pick another name, or "
                "upload a new version of it with POST /v1/adapters"
            )
        if public:
            _check_public(registry, name, owner)
        others = [f for f in _unfinished(registry, owner) if f.name != name]
        check_unfinished(len(others) + 1, limits)
        return registry.staged.create(owner, name, base, description, public)


def listed(registry: Registry, owner: str) -> list[tuple[Staged, bool]]:
    """owner's finetunes, each with whether it is public now: unfinished ones, and complete
    ones whose name still exists."""
    entries = {e.name: e for e in registry.list(owner)}
    found = []
    for staged in _live(registry, registry.staged.list(owner)):
        if not staged.published:
            found.append((staged, staged.public))
        elif staged.name in entries:
            found.append((staged, entries[staged.name].public))
    return found


def public(registry: Registry) -> list[Staged]:
    """The complete finetunes whose adapter is public."""
    found = []
    for name, owner in registry.public_names().items():
        staged = registry.staged.of_name(owner, name)
        if staged is not None and staged.published:
            found.append(staged)
    return found


def receive(
    settings: AppSettings, owner: str, finetune_id: str, file_name: str, data: bytes,
    limits: Limits,
) -> tuple[Staged, tuple[str, ...]]:  # fmt: skip
    """Keep one of owner's finetune's files; with both in, check the adapter whole and
    publish it. A file that fails is not kept. (The finetune, and the adapter's warnings.)"""
    registry = settings.registry
    with tenant_lock(owner):
        staged = own(registry, owner, finetune_id)
        if staged.published:
            raise ApiError(409, f"finetune {staged.name!r} is complete and its files cannot "
                                "change: create a new finetune, or upload a new version of "
                                "the adapter with POST /v1/adapters")  # fmt: skip
        _check_alone(settings, file_name, data)
        if limits.get("max_adapter_mb") is not None:
            staged_bytes = sum(
                n for f in _unfinished(registry, owner)
                for k, n in f.sizes.items() if (f.id, k) != (staged.id, file_name)
            )  # fmt: skip
            check_staged_bytes(holdings(registry, owner), staged_bytes, len(data), limits)
        earlier = registry.staged.files(staged.id).get(file_name)
        staged = registry.staged.put_file(staged, file_name, data)
        files = registry.staged.files(staged.id)  # another replica may have brought the other
        if not all(name in files for name in ASSETS):
            return staged, ()
        try:
            adapter = validate_upload(settings, {name: files[name] for name in ASSETS}, None)
            _publish(registry, staged, adapter, limits)
        except (ApiError, AdapterError):
            if earlier is None:  # the file that failed is not kept
                registry.staged.remove_file(staged, file_name)
            else:
                registry.staged.put_file(staged, file_name, earlier)
            raise
        return registry.staged.mark_published(staged), adapter.warnings


def own(registry: Registry, owner: str, finetune_id: str) -> Staged:
    """owner's finetune of this id; 404 for any other, another account's or none at all."""
    staged = registry.staged.get(finetune_id)
    current = staged and registry.staged.of_name(staged.owner, staged.name)
    if staged is None or staged.owner != owner or current is None or current.id != staged.id:
        raise ApiError(404, f"unknown finetune {quoted(finetune_id)}")
    return staged


def version_of(registry: Registry, tenant: str, finetune_id: str) -> Version | None:
    """The version a finetune's id runs for a caller of tenant; None if it names none the
    caller may see; 404 for the caller's own one still missing files."""
    staged = visible_staged(registry, tenant, finetune_id)
    if staged is None:
        return None
    if not staged.published:
        raise ApiError(404, f"finetune {staged.name!r} is not ready: upload its {CONFIG} and "
                            f"{WEIGHTS} first")  # fmt: skip
    try:
        return registry.resolve(staged.name, staged.owner)
    except UnknownAdapter:  # its adapter was deleted since
        return None


def _publish(registry: Registry, staged: Staged, adapter, limits: Limits) -> None:
    """Point the finetune's name at adapter (and make it public, if asked)."""
    name, owner = staged.name, staged.owner
    if registry.exists(name, owner):  # published already by a replica, or taken since
        if registry.resolve(name, owner).digest == adapter.digest:
            return
        raise NameConflict(
            f"an adapter named {name!r} was uploaded to this account after the finetune was "
            "created: create the finetune again under another name"
        )
    if staged.public:
        _check_public(registry, name, owner)
    publish_upload(registry, name, adapter, owner, limits)
    if staged.public:
        registry.set_public(name, owner, True)


def _check_alone(settings: AppSettings, file_name: str, data: bytes) -> None:
    """What one file can be checked for before its pair is in; 400 naming the fault."""
    try:
        if file_name == PICKLE_WEIGHTS:
            raise pickle_refused()
        if file_name not in ASSETS:
            raise AdapterError(f"file_name: {quoted(file_name)} is not a finetune file; send "
                               f"{CONFIG} and {WEIGHTS}, one per call")  # fmt: skip
        if file_name == CONFIG:
            parse_config(data, "adapter", settings.max_lora_rank)
        else:
            check_header(data, f"adapter: {WEIGHTS}")
    except AdapterError as exc:
        raise ApiError(400, str(exc)) from None


def _check_public(registry: Registry, name: str, owner: str) -> None:
    if registry.public_owner(name) not in (None, owner):
        raise NameConflict(f"another account's adapter {name!r} is public already")


def _unfinished(registry: Registry, owner: str) -> list[Staged]:
    return [f for f in _live(registry, registry.staged.list(owner)) if not f.published]


def _live(registry: Registry, found: list[Staged]) -> list[Staged]:
    """found without the unfinished finetunes untouched for UNFINISHED_TTL_S (dropped now)."""
    now, live = time.time(), []
    for staged in found:
        idle = now - (iso_seconds(staged.modified) or 0.0)
        if not staged.published and idle > UNFINISHED_TTL_S:
            registry.staged.drop(staged)
        else:
            live.append(staged)
    return live
