"""Adapter management over HTTP: upload, list, show, delete, mark public (OpenAI error style).

An upload is validated whole against the served model (shapes, layers, modules, rank up
to lora.max_lora_rank; a draft companion against the draft model when one is configured)
before anything is stored. Names are per tenant: an upload publishes under the key's own
tenant (an admin may name another with the form field `tenant`), so two tenants may each
own `support-bot`. Who sees and manages what is adapters.registry.visibility's rule: a user key sees
its own tenant's adapters and the public ones and manages its own only; an adapter it may
not see answers 404 word for word as a missing one. Admin keys list and manage every
tenant's (`?tenant=` names one) and mark adapters public. Registry calls are blocking I/O
and run in worker threads.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, File, Form, Query, UploadFile
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError
from adapters.format.sources import CONFIG, PICKLE_WEIGHTS, WEIGHTS
from adapters.registry.names import validate_name
from adapters.registry.records import Entry
from adapters.registry.registry import Registry
from adapters.registry.visibility import manageable, visible_entry
from serving.api.admin.adapter_json import entry_json, version_json
from serving.api.core.adapter_errors import registry_call
from serving.api.core.adapter_upload import publish_upload, validate_upload
from serving.api.core.caller import Principal, authenticate
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.quotas import tenant_lock

router = APIRouter(tags=["Adapters"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
Tenant = Annotated[str | None, Query(description="Admin keys: the tenant whose adapter.")]
DRAFT_CONFIG, DRAFT_WEIGHTS = f"draft_{CONFIG}", f"draft_{WEIGHTS}"


@router.post("/v1/adapters", status_code=201, summary="Upload an adapter version")
async def upload(
    ctx: Ctx,
    caller: Caller,
    name: Annotated[str, Form(description="The adapter's name.")],
    config: Annotated[UploadFile, File(alias=CONFIG, description="PEFT's adapter config.")],
    weights: Annotated[
        UploadFile | None, File(alias=WEIGHTS, description="The LoRA tensors (required).")
    ] = None,
    pickled: Annotated[
        UploadFile | None,
        File(
            alias=PICKLE_WEIGHTS,
            description="Refused: pickle is never loaded (a 400 that "
            "says how to convert it to adapter_model.safetensors).",
        ),
    ] = None,
    draft_config: Annotated[UploadFile | None, File(alias=DRAFT_CONFIG)] = None,
    draft_weights: Annotated[UploadFile | None, File(alias=DRAFT_WEIGHTS)] = None,
    tenant: Annotated[str | None, Form(description="Admin keys: publish for this tenant.")] = None,
):
    _valid_name(name)
    owner = _target_tenant(caller, tenant)
    if (draft_config is None) != (draft_weights is None):
        raise ApiError(400, f"a draft companion needs both {DRAFT_CONFIG} and {DRAFT_WEIGHTS}")
    files = {CONFIG: await config.read()}
    if weights is not None:
        files[WEIGHTS] = await weights.read()
    elif pickled is not None:  # named, never read: parse_adapter says how to convert it
        files[PICKLE_WEIGHTS] = b""
    draft = None
    if draft_config is not None:
        draft = {CONFIG: await draft_config.read(), WEIGHTS: await draft_weights.read()}
    adapter = await run_in_threadpool(validate_upload, ctx.settings, files, draft)
    limits = ctx.settings.limits_of(owner)
    version = await registry_call(
        publish_upload, ctx.settings.registry, name, adapter, owner, limits
    )
    return {**version_json(version), "warnings": list(adapter.warnings)}


@router.get("/v1/adapters", summary="Adapters this key may see (every tenant's for an admin)")
async def list_adapters(ctx: Ctx, caller: Caller, tenant: Tenant = None):
    registry = ctx.settings.registry
    if caller.is_admin:
        entries = await registry_call(registry.list, tenant)
    else:
        _target_tenant(caller, tenant)
        entries = await registry_call(registry.list_visible, caller.tenant)
    return {"object": "list", "data": [entry_json(e) for e in entries]}


@router.get("/v1/adapters/{name}", summary="One adapter with its version history")
async def show_adapter(name: str, ctx: Ctx, caller: Caller, tenant: Tenant = None):
    _valid_name(name)
    entry = await registry_call(_visible, ctx.settings.registry, caller, name, tenant)
    return {**entry_json(entry), "history": list(entry.history)}


@router.delete("/v1/adapters/{name}", summary="Delete a name; its versions stay immutable")
async def delete_adapter(name: str, ctx: Ctx, caller: Caller, tenant: Tenant = None):
    _valid_name(name)
    await registry_call(_delete, ctx.settings.registry, caller, name, tenant)
    return {"id": name, "object": "adapter", "deleted": True}


@router.patch("/v1/adapters/{name}", summary="Mark an adapter public or private (admin keys)")
async def set_public(
    name: str,
    ctx: Ctx,
    caller: Caller,
    public: Annotated[bool, Body(embed=True, description="Usable by every tenant.")],
    tenant: Tenant = None,
):
    _valid_name(name)
    entry = await registry_call(_set_public, ctx.settings.registry, caller, name, tenant, public)
    return entry_json(entry)


def _target_tenant(caller: Principal, tenant: str | None) -> str:
    """The tenant a request addresses: the caller's own, or any one for an admin key."""
    if tenant is None or tenant == caller.tenant:
        return caller.tenant
    if not caller.is_admin:
        raise ApiError(
            403,
            f"this key manages the adapters of tenant {caller.tenant!r} only",
            code="permission_denied",
        )
    return tenant


def _visible(registry: Registry, caller: Principal, name: str, tenant: str | None) -> Entry:
    return visible_entry(registry, caller.tenant, caller.is_admin, name, tenant)


def _delete(registry: Registry, caller: Principal, name: str, tenant: str | None) -> None:
    entry = manageable(registry, caller.tenant, caller.is_admin, name, tenant)
    with tenant_lock(entry.owner):
        registry.delete(name, entry.owner)


def _set_public(
    registry: Registry, caller: Principal, name: str, tenant: str | None, public: bool
) -> Entry:
    # 404 first, as everywhere; an admin names the owner of another tenant's public adapter
    entry = manageable(registry, caller.tenant, caller.is_admin, name, tenant)
    if not caller.is_admin:
        raise ApiError(403, "only an admin key can make an adapter public or private",
                       code="permission_denied")  # fmt: skip
    with tenant_lock(entry.owner):
        return registry.set_public(name, entry.owner, public)


def _valid_name(name: str) -> None:
    try:
        validate_name(name)
    except AdapterError as exc:
        raise ApiError(400, str(exc)) from None
