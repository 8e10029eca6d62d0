"""An uploaded adapter, checked and published: the one path every upload route takes
(POST /v1/adapters, and Workers AI's finetunes once their files are all in).

validate_upload checks the files whole against the served model (shapes, layers,
modules, rank up to lora.max_lora_rank; a draft companion against the draft model) before
anything is stored; publish_upload points the tenant's name at it within the tenant's
quotas. Both block: routes run them in worker threads.
"""

from __future__ import annotations

import dataclasses

from adapters.errors import AdapterError
from adapters.format.adapter import Adapter, parse_adapter
from adapters.registry.records import Version
from adapters.registry.registry import Registry
from serving.api.core.errors import ApiError
from serving.api.core.quotas import check_quota, holdings, tenant_lock
from serving.api.core.settings import AppSettings


def validate_upload(settings: AppSettings, files: dict, draft_files: dict | None) -> Adapter:
    """The adapter files (and draft_files) make, checked; ApiError 400 naming the fault."""
    if draft_files is not None and settings.draft_spec is None:
        # Nothing to check it against, and nothing would serve it: stored unchecked, it
        # would fail only once a draft model is configured.
        raise ApiError(400, "this server runs no draft model (draft.method is not "
                            "draft_model): upload the adapter without its draft companion")  # fmt: skip
    try:
        draft = None
        if draft_files is not None:
            draft = parse_adapter(
                draft_files,
                base=settings.draft_spec,
                max_rank=settings.max_lora_rank,
                label="draft",
            )
        return parse_adapter(
            files,
            base=settings.base_spec,
            base_name=settings.model_id,
            max_rank=settings.max_lora_rank,
            draft=draft,
        )
    except AdapterError as exc:
        raise ApiError(400, str(exc)) from None


def publish_upload(registry: Registry, name: str, adapter: Adapter, owner: str, limits) -> Version:
    """owner's name pointed at adapter, within limits (max_adapters, max_adapter_mb)."""
    with tenant_lock(owner):
        if any(limits.get(k) is not None for k in ("max_adapters", "max_adapter_mb")):
            check_quota(holdings(registry, owner), name, adapter.digest, adapter.num_bytes, limits)
        version = registry.publish(name, adapter, owner)
        # When the name moved there, not when the content was first stored: that may have
        # been another tenant's upload of the same bytes, which this one must not learn of.
        moved = registry.show(name, owner).updated
    return dataclasses.replace(version, created=moved)
