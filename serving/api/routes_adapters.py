"""Adapter management over HTTP: upload, list, show, delete (OpenAI error style).

An upload is validated whole against the served model (shapes, layers, modules, rank up
to lora.max_lora_rank; a draft companion against the draft model when one is configured)
before anything is stored. Names belong to the uploading key's tenant: a user key may not
publish over another tenant's name (403), and to it another tenant's adapter does not exist
when shown or deleted (404, word for word as for a missing name); an admin key may do all,
and publishing over a name keeps its owner. Registry calls are blocking I/O and run in
worker threads.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, UploadFile
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError
from adapters.format import Adapter, parse_adapter
from adapters.names import validate_name
from adapters.registry import Entry, Registry, Version
from adapters.sources import CONFIG, WEIGHTS
from serving.api.auth import Principal, authenticate, require_manage
from serving.api.context import ApiContext, api_context
from serving.api.errors import ApiError
from serving.api.settings import AppSettings

router = APIRouter(tags=["Adapters"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
DRAFT_CONFIG, DRAFT_WEIGHTS = f"draft_{CONFIG}", f"draft_{WEIGHTS}"


@router.post("/v1/adapters", status_code=201, summary="Upload an adapter version")
async def upload(
    ctx: Ctx,
    caller: Caller,
    name: Annotated[str, Form(description="The adapter's name.")],
    config: Annotated[UploadFile, File(alias=CONFIG, description="PEFT's adapter config.")],
    weights: Annotated[UploadFile, File(alias=WEIGHTS, description="The LoRA tensors.")],
    draft_config: Annotated[UploadFile | None, File(alias=DRAFT_CONFIG)] = None,
    draft_weights: Annotated[UploadFile | None, File(alias=DRAFT_WEIGHTS)] = None,
):
    _valid_name(name)
    if (draft_config is None) != (draft_weights is None):
        raise ApiError(400, f"a draft companion needs both {DRAFT_CONFIG} and {DRAFT_WEIGHTS}")
    files = {CONFIG: await config.read(), WEIGHTS: await weights.read()}
    draft = None
    if draft_config is not None:
        draft = {CONFIG: await draft_config.read(), WEIGHTS: await draft_weights.read()}
    adapter = await run_in_threadpool(_validate, ctx.settings, files, draft)
    version = await _registry_call(_publish, ctx.settings.registry, name, adapter, caller)
    return {**_version_json(version), "warnings": list(adapter.warnings)}


@router.get("/v1/adapters", summary="Adapters of this key's tenant (all for an admin key)")
async def list_adapters(ctx: Ctx, caller: Caller):
    owner = None if caller.is_admin else caller.tenant
    entries = await _registry_call(ctx.settings.registry.list, owner)
    return {"object": "list", "data": [_entry_json(e) for e in entries]}


@router.get("/v1/adapters/{name}", summary="One adapter with its version history")
async def show_adapter(name: str, ctx: Ctx, caller: Caller):
    _valid_name(name)
    entry = await _registry_call(_visible, ctx.settings.registry, name, caller)
    return {**_entry_json(entry), "history": list(entry.history)}


@router.delete("/v1/adapters/{name}", summary="Delete a name; its versions stay immutable")
async def delete_adapter(name: str, ctx: Ctx, caller: Caller):
    _valid_name(name)
    await _registry_call(_delete, ctx.settings.registry, name, caller)
    return {"id": name, "object": "adapter", "deleted": True}


def _validate(settings: AppSettings, files: dict, draft_files: dict | None) -> Adapter:
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


def _publish(registry: Registry, name: str, adapter: Adapter, caller: Principal) -> Version:
    owner = caller.tenant
    if registry.exists(name):
        owner = registry.resolve(name).owner
        require_manage(caller, owner, name)
    try:
        return registry.publish(name, adapter, owner)
    except AdapterError:
        # Another tenant created the name between the check and the publish.
        if registry.exists(name):
            require_manage(caller, registry.resolve(name).owner, name)
        raise


def _visible(registry: Registry, name: str, caller: Principal) -> Entry:
    """name's entry, as the registry's own "unknown adapter" when caller may not manage it."""
    entry = registry.show(name)
    if not caller.may_manage(entry.owner):
        # Word for word the registry's answer for a name it lacks (a test holds them equal),
        # so that another tenant's names cannot be told from missing ones.
        raise AdapterError(f"unknown adapter {name!r}")
    return entry


def _delete(registry: Registry, name: str, caller: Principal) -> None:
    _visible(registry, name, caller)
    registry.delete(name)


async def _registry_call(fn, *args):
    try:
        return await run_in_threadpool(fn, *args)
    except AdapterError as exc:
        # The registry's "unknown adapter ..." means absent; other refusals are the request's.
        status = 404 if str(exc).startswith("unknown ") else 400
        code = "adapter_not_found" if status == 404 else None
        raise ApiError(status, str(exc), code=code) from None
    except OSError:
        raise ApiError(503, "the adapter registry cannot be reached; try again") from None


def _valid_name(name: str) -> None:
    try:
        validate_name(name)
    except AdapterError as exc:
        raise ApiError(400, str(exc)) from None


def _version_json(v: Version) -> dict:
    return {
        "object": "adapter",
        "name": v.name,
        "version": v.ref,
        "digest": v.digest,
        "owner": v.owner,
        "rank": v.rank,
        "alpha": v.alpha,
        "scale": v.scale,
        "target_modules": list(v.target_modules),
        "num_bytes": v.num_bytes,
        "has_draft": v.has_draft,
        "created": v.created,
    }


def _entry_json(e: Entry) -> dict:
    return {
        "object": "adapter",
        "name": e.name,
        "version": f"{e.name}@{e.digest}",
        "digest": e.digest,
        "owner": e.owner,
        "rank": e.rank,
        "target_modules": list(e.target_modules),
        "num_bytes": e.num_bytes,
        "updated": e.updated,
    }
