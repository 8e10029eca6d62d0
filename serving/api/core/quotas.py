"""A tenant's quotas, and the 429 of each: adapters (how many names it may own and how many
MB they may hold), batch files (how many it keeps and their MB) and batch requests queued.

Storage counts every version the tenant's names have pointed to (each name's history):
older versions stay stored and reachable as `name@digest` until the name is deleted and
`loraserve adapters gc` collects them, so they count until then. A version stored once
counts once per tenant. The check reads the tenant's holdings, then publishes, under the
tenant's lock (tenant_lock), so that uploads racing past the last slot cannot both land
through one API process; through several, the next upload sees what landed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from adapters.errors import AdapterError
from adapters.registry.registry import Registry
from serving.api.core.errors import ApiError
from serving.batch.files import FileQuotaFull
from serving.batch.records import BatchHoldings
from serving.batch.store import BatchQueueFull

MB = 2**20
# Finetunes still missing a file that a tenant may hold where max_adapters sets no bound:
# each keeps what it has received, up to the largest adapter the model takes.
MAX_UNFINISHED = 64
# Held weakly: a tenant's lock lives while someone holds it or waits for it (each keeps a
# reference), so the table holds the tenants writing now, not every tenant that ever wrote.
# Reentrant: a finetune's publish takes it inside the step that holds it for its files.
_locks: weakref.WeakValueDictionary[str, threading.RLock] = weakref.WeakValueDictionary()
_locks_lock = threading.Lock()


def tenant_lock(tenant: str) -> threading.RLock:
    """The lock a tenant's adapter writes (publish, delete, public flag) take in this process:
    a quota check and its publish are one step, and a delete does not remove a name's folder
    while an upload writes into it (the store then fails, read as an unreachable registry)."""
    with _locks_lock:
        lock = _locks.get(tenant)
        if lock is None:
            lock = _locks[tenant] = threading.RLock()
        return lock


def num_tenant_locks() -> int:
    """Tenants whose lock someone holds or waits for now."""
    return len(_locks)


@dataclass(frozen=True)
class Holdings:
    """What a tenant stores: its names, and the size of every version they pointed to."""

    names: frozenset[str]
    sizes: Mapping[str, int]  # digest -> bytes


def holdings(registry: Registry, owner: str) -> Holdings:
    """owner's names and stored versions, read from the registry (blocking I/O)."""
    names, sizes = set(), {}
    for entry in registry.list(owner):
        names.add(entry.name)
        sizes[entry.digest] = entry.num_bytes
        for digest in registry.show(entry.name, owner).history:
            if digest not in sizes:
                try:
                    sizes[digest] = registry.resolve(f"{entry.name}@{digest}", owner).num_bytes
                except AdapterError:  # incomplete or collected: it holds no space
                    continue
    return Holdings(frozenset(names), sizes)


def check_quota(
    held: Holdings, name: str, digest: str, num_bytes: int, limits: Mapping[str, int | None]
) -> None:
    """429 unless the tenant holding `held` may publish a version (digest, num_bytes) as name."""
    max_adapters = limits.get("max_adapters")
    owned = len(held.names - {name})
    if max_adapters is not None and owned + 1 > max_adapters:
        raise _exceeded(
            f"this tenant may own at most {max_adapters} adapter(s) and owns {owned}; "
            "delete one to upload another"
        )
    max_mb = limits.get("max_adapter_mb")
    used = sum(held.sizes.values())
    after = used + (0 if digest in held.sizes else num_bytes)
    if max_mb is not None and after > max_mb * MB:
        raise _exceeded(
            f"this upload ({num_bytes / MB:.1f} MB) would take this tenant's stored adapter "
            f"versions to {after / MB:.1f} MB, above its limit of {max_mb} MB; deleting a "
            "name frees its versions"
        )


def check_unfinished(count: int, limits: Mapping[str, int | None]) -> None:
    """429 unless a tenant may hold `count` finetunes still missing files: as many as
    max_adapters allows, else MAX_UNFINISHED."""
    most = limits.get("max_adapters")
    most = MAX_UNFINISHED if most is None else most
    if count > most:
        raise _exceeded(
            f"this tenant may hold at most {most} finetunes still missing files and holds "
            f"{count - 1}: upload their files, or create one again under its name"
        )


def check_staged_bytes(
    held: Holdings, staged_bytes: int, num_bytes: int, limits: Mapping[str, int | None]
) -> None:
    """429 unless a tenant holding `held` and staged_bytes in unfinished finetunes may keep
    one more staged file of num_bytes under max_adapter_mb."""
    max_mb = limits.get("max_adapter_mb")
    after = sum(held.sizes.values()) + staged_bytes + num_bytes
    if max_mb is not None and after > max_mb * MB:
        raise _exceeded(
            f"this file ({num_bytes / MB:.1f} MB) would take this tenant's stored adapters and "
            f"unfinished finetunes to {after / MB:.1f} MB, above its limit of {max_mb} MB"
        )


def file_limits(limits: Mapping[str, int | None]) -> dict[str, int | None]:
    """BatchStore.add_file's max_files and max_bytes under a tenant's limits."""
    most_mb = limits.get("batch_file_mb")
    return {"max_files": limits.get("batch_files"),
            "max_bytes": None if most_mb is None else most_mb * MB}  # fmt: skip


def files_full(exc: FileQuotaFull) -> ApiError:
    """The 429 of an upload past the tenant's batch_files or batch_file_mb."""
    if exc.limit_name == "batch_files":
        return _exceeded(
            f"this tenant keeps {exc.used} batch file(s) and may keep at most {exc.limit} "
            "(batch_files); delete one to upload another"
        )
    return _exceeded(
        f"this upload ({exc.asked / MB:.1f} MB) would take this tenant's batch files to "
        f"{(exc.used + exc.asked) / MB:.1f} MB, above its batch_file_mb limit of "
        f"{exc.limit // MB} MB; deleting files frees their space"
    )


def queue_full(exc: BatchQueueFull) -> ApiError:
    """The 429 of a submit past the tenant's batch_queued_requests; no Retry-After, since
    room comes back as its queued requests end, not at a time known now."""
    hint = "" if exc.asked > exc.limit else "; submit again once some have ended"
    return ApiError(429, f"batch limit (batch_queued_requests): {exc}{hint}",
                    code="batch_queue_full")  # fmt: skip


def quota_figures(
    limits: Mapping[str, int | None], held: Holdings | None, batch: BatchHoldings | None
) -> dict[str, dict]:
    """Each quota's {"used", "limit"} (limit None: none); used None where what it counts
    could not be read (held: the registry's, batch: the batch store's)."""
    used = {
        "max_adapters": held and len(held.names),
        "max_adapter_mb": held and round(sum(held.sizes.values()) / MB, 3),
        "batch_files": batch and batch.files,
        "batch_file_mb": batch and round(batch.file_bytes / MB, 3),
        "batch_queued_requests": batch and batch.pending,
    }
    return {name: {"used": n, "limit": limits.get(name)} for name, n in used.items()}


def _exceeded(message: str) -> ApiError:
    return ApiError(429, f"quota exceeded: {message}", code="insufficient_quota")
