"""A tenant's adapter quotas: how many names it may own and how many MB they may hold.

Storage counts each name's latest version (what the tenant is serving); older versions
stay reachable by digest but are the registry's to collect (`loraserve adapters gc`).
The check reads the tenant's list, then publishes: two uploads racing past the last slot
can both land, which the next upload then sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adapters.registry import Entry
from serving.api.errors import ApiError

MB = 2**20


def check_quota(
    owned: Sequence[Entry], name: str, num_bytes: int, limits: Mapping[str, int | None]
) -> None:
    """429 unless the tenant owning `owned` may publish num_bytes under name."""
    others = [e for e in owned if e.name != name]
    max_adapters = limits.get("max_adapters")
    if max_adapters is not None and len(others) + 1 > max_adapters:
        raise _exceeded(
            f"this tenant may own at most {max_adapters} adapter(s) and owns {len(others)}; "
            "delete one to upload another"
        )
    max_mb = limits.get("max_adapter_mb")
    used = sum(e.num_bytes for e in others)
    if max_mb is not None and used + num_bytes > max_mb * MB:
        raise _exceeded(
            f"this upload ({num_bytes / MB:.1f} MB) would take this tenant's adapters to "
            f"{(used + num_bytes) / MB:.1f} MB, above its limit of {max_mb} MB"
        )


def _exceeded(message: str) -> ApiError:
    return ApiError(429, f"quota exceeded: {message}", code="insufficient_quota")
