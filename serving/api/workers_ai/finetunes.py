"""Workers AI's finetunes are adapters: create one empty, upload its two files, run it.

    POST /ai/finetunes                         {"model", "name", "description", "public"}
    GET  /ai/finetunes                         the account's finetunes
    GET  /ai/finetunes/public                  public ones (?limit=&offset=&orderBy=)
    POST /ai/finetunes/{id}/finetune-assets    multipart `file` + `file_name`

(and under Cloudflare's account prefixes, serving.api.core.cloudflare_paths). A finetune
is an adapter staged a file at a time (adapters.registry.staged): once adapter_config.json
and adapter_model.safetensors are both in, they pass the checks of POST /v1/adapters
(serving.api.core.adapter_upload) and are published to the tenant's name, after which
the finetune's id and its name both work as `lora`. Until then it serves nothing. A file
that fails the checks is not kept, so the finetune stays as it was; a complete finetune's
files cannot change (a new version goes through POST /v1/adapters).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError, NameConflict, quoted
from adapters.format.peft_config import parse_config
from adapters.format.sources import CONFIG, PICKLE_WEIGHTS, WEIGHTS
from adapters.registry.names import validate_name
from adapters.registry.records import Version
from adapters.registry.registry import Registry
from adapters.registry.staged import UUID_RE, Staged
from serving.api.core.adapter_errors import adapter_http_error
from serving.api.core.adapter_upload import publish_upload, validate_upload
from serving.api.core.caller import Principal, authenticate
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.quotas import tenant_lock
from serving.api.core.settings import AppSettings

router = APIRouter(tags=["Workers AI finetunes"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
ASSETS = (CONFIG, WEIGHTS)
# Finetunes still missing a file that one account may hold: each keeps the files it has
# received (up to the largest adapter each), and there is no route to delete one.
MAX_UNFINISHED = 64


class FinetuneCreate(BaseModel):
    """POST /ai/finetunes: a new, empty finetune of the served model."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=256, description="The served model's id.")
    name: str = Field(max_length=64, description="The adapter name it publishes to.")
    description: str = Field("", max_length=1024)
    public: bool = Field(False, description="Usable by every account (admin keys).")


def envelope(result: object) -> dict:
    """A successful answer in Cloudflare's envelope."""
    return {"result": result, "success": True, "errors": [], "messages": []}


def finetune_json(staged: Staged) -> dict:
    """A finetune as Workers AI lists it."""
    return {
        "id": staged.id,
        "name": staged.name,
        "model": staged.base,
        "description": staged.description,
        "public": staged.public,
        "created_at": staged.created,
        "modified_at": staged.modified,
        "ready": staged.published,  # both files in, checked and published
    }


@router.post("/ai/finetunes", summary="Create an empty finetune (Workers AI)")
async def create(body: FinetuneCreate, ctx: Ctx, caller: Caller):
    s = ctx.settings
    if body.model != s.model_id:
        raise ApiError(400, f"model: unknown model {quoted(body.model)}; this server serves "
                            f"{s.model_id!r}")  # fmt: skip
    try:
        validate_name(body.name)
    except AdapterError as exc:
        raise ApiError(400, f"name: {exc}") from None
    if body.public and not caller.is_admin:
        raise ApiError(403, "only an admin key can make a finetune public")
    staged = await _registry_call(_create, s.registry, caller.tenant, body)
    return envelope(finetune_json(staged))


@router.get("/ai/finetunes", summary="The account's finetunes (Workers AI)")
async def list_finetunes(ctx: Ctx, caller: Caller):
    found = await _registry_call(_listed, ctx.settings.registry, caller.tenant)
    return envelope([finetune_json(f) for f in found])


@router.get("/ai/finetunes/public", summary="Public finetunes (Workers AI)")
async def list_public(
    ctx: Ctx,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    order_by: Annotated[str, Query(alias="orderBy", max_length=64)] = "created_at",
):
    found = await _registry_call(_public, ctx.settings.registry, caller.tenant)
    rows = [finetune_json(f) for f in found]
    if order_by not in ("created_at", "modified_at", "name", "id"):
        raise ApiError(400, f"orderBy: unknown column {quoted(order_by)}; use created_at, "
                            "modified_at, name or id")  # fmt: skip
    rows.sort(key=lambda row: (row[order_by], row["id"]))
    return envelope(rows[offset : offset + limit])


@router.post("/ai/finetunes/{finetune_id}/finetune-assets", summary="Upload a finetune's file")
async def upload_asset(
    finetune_id: str,
    ctx: Ctx,
    caller: Caller,
    file: Annotated[UploadFile, File(description="The file's bytes.")],
    file_name: Annotated[str, Form(max_length=256, description=" or ".join(ASSETS))],
):
    s = ctx.settings
    staged = await _registry_call(_own, s.registry, caller.tenant, finetune_id)
    if file_name == PICKLE_WEIGHTS:  # the one message every upload route gives for pickle
        validate_upload(s, {CONFIG: b"", PICKLE_WEIGHTS: b""}, None)
    if file_name not in ASSETS:
        raise ApiError(400, f"file_name: {quoted(file_name)} is not a finetune file; send "
                            f"{CONFIG} and {WEIGHTS}, one per call")  # fmt: skip
    if staged.published:
        raise ApiError(409, f"finetune {staged.name!r} is complete and its files cannot change: "
                            "create a new finetune, or upload a new version of the adapter "
                            "with POST /v1/adapters")  # fmt: skip
    data = await file.read()
    limits = s.limits_of(caller.tenant)
    staged = await _registry_call(_receive, s, staged, file_name, data, limits)
    return envelope(finetune_json(staged))


async def finetune_version(settings: AppSettings, caller: Principal, lora: str) -> Version | None:
    """The version a `lora` naming a finetune by its id runs, None if it names none the
    caller may see (then it is read as an adapter name); 404 for one still missing files."""
    if not UUID_RE.fullmatch(lora):
        return None
    return await _registry_call(_finetune_version, settings.registry, caller, lora)


def _create(registry: Registry, owner: str, body: FinetuneCreate) -> Staged:
    with tenant_lock(owner):
        if registry.exists(body.name, owner):
            raise NameConflict(
                f"this account already has an adapter named {body.name!r}: pick another "
                "name, or upload a new version of it with POST /v1/adapters"
            )
        earlier = registry.staged.of_name(owner, body.name)  # unfinished: this one replaces it
        unfinished = [f for f in registry.staged.list(owner) if not f.published]
        if len(unfinished) >= MAX_UNFINISHED and earlier not in unfinished:
            raise AdapterError(
                f"this account has {len(unfinished)} finetunes still missing files, the most "
                "it may hold: upload their files, or create one again under its name"
            )
        if body.public and registry.public_owner(body.name) not in (None, owner):
            raise NameConflict(f"another account's adapter {body.name!r} is public already")
        return registry.staged.create(owner, body.name, body.model, body.description, body.public)


def _listed(registry: Registry, owner: str) -> list[Staged]:
    """owner's finetunes: unfinished ones, and complete ones whose name still exists."""
    return [
        f for f in registry.staged.list(owner)
        if not f.published or registry.exists(f.name, owner)
    ]  # fmt: skip


def _public(registry: Registry, tenant: str) -> list[Staged]:
    """The complete finetunes whose adapter is public."""
    found = []
    for entry in registry.list_visible(tenant):
        staged = registry.staged.of_name(entry.owner, entry.name) if entry.public else None
        if staged is not None and staged.published:
            found.append(staged)
    return found


def _own(registry: Registry, tenant: str, finetune_id: str) -> Staged:
    staged = registry.staged.get(finetune_id)
    if staged is None or staged.owner != tenant:  # another account's reads as none at all
        raise ApiError(404, f"unknown finetune {quoted(finetune_id)}")
    return staged


def _receive(settings: AppSettings, staged: Staged, file_name: str, data: bytes, limits) -> Staged:
    """Keep one file; with both in, check the adapter whole and publish it. A file that fails
    is not kept."""
    registry = settings.registry
    # Under the tenant's lock, so that two calls bringing the two files at once (in this
    # process) cannot each find the other's missing and leave the finetune unpublished.
    with tenant_lock(staged.owner):
        files = {**registry.staged.files(staged.id), file_name: data}
        if not all(name in files for name in ASSETS):
            if file_name == CONFIG:  # checked alone now, rather than when the weights arrive
                try:
                    parse_config(data, "adapter", settings.max_lora_rank)
                except AdapterError as exc:
                    raise ApiError(400, str(exc)) from None
            return registry.staged.put_file(staged, file_name, data)
        if staged.public and registry.public_owner(staged.name) not in (None, staged.owner):
            raise NameConflict(f"another account's adapter {staged.name!r} is public already")
    adapter = validate_upload(settings, {name: files[name] for name in ASSETS}, None)
    publish_upload(registry, staged.name, adapter, staged.owner, limits)  # takes the lock
    if staged.public:
        with tenant_lock(staged.owner):
            registry.set_public(staged.name, staged.owner, True)
    return registry.staged.mark_published(staged)


def _finetune_version(registry: Registry, caller: Principal, finetune_id: str) -> Version | None:
    staged = registry.staged.get(finetune_id)
    if staged is None:
        return None
    own = staged.owner == caller.tenant
    if not (own or caller.is_admin or registry.public_owner(staged.name) == staged.owner):
        return None
    if not staged.published:
        if not own and not caller.is_admin:
            return None
        raise ApiError(404, f"finetune {staged.name!r} is not ready: upload its {CONFIG} and "
                            f"{WEIGHTS} first")  # fmt: skip
    return registry.resolve(staged.name, staged.owner)


async def _registry_call(fn, *args):
    try:
        return await run_in_threadpool(fn, *args)
    except AdapterError as exc:
        raise adapter_http_error(exc) from None
