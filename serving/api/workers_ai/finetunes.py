"""Workers AI's finetunes are adapters: create one empty, upload its two files, run it.

    POST /ai/finetunes                         {"model", "name", "description", "public"}
    GET  /ai/finetunes                         the account's finetunes
    GET  /ai/finetunes/public                  public ones (?limit=&offset=&orderBy=)
    POST /ai/finetunes/{id}/finetune-assets    multipart `file` + `file_name`

(and under Cloudflare's account prefixes, serving.api.core.cloudflare_paths). Once
adapter_config.json and adapter_model.safetensors are both in, they pass the checks of
POST /v1/adapters and are published to the account's adapter name; the finetune's id then
works as `lora` on the Workers-AI routes, as its name does. Until then it serves nothing. A
file that fails a check is not kept, and a complete finetune's files cannot change (a new
version goes through POST /v1/adapters). The steps themselves: finetune_staging.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from pydantic import BaseModel, ConfigDict, Field

from adapters.errors import AdapterError, quoted
from adapters.registry.names import validate_name
from adapters.registry.records import Version
from adapters.registry.staged import UUID_RE, Staged
from serving.api.core.adapter_errors import registry_call
from serving.api.core.caller import Principal, authenticate
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.settings import AppSettings
from serving.api.workers_ai import finetune_staging as staging
from serving.api.workers_ai.envelope import envelope

router = APIRouter(tags=["Workers AI finetunes"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
ORDER_BY = ("created_at", "modified_at", "name", "id")


class FinetuneCreate(BaseModel):
    """POST /ai/finetunes: a new, empty finetune of the served model."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=256, description="The served model's id.")
    name: str = Field(max_length=64, description="The adapter name it publishes to.")
    description: str = Field("", max_length=1024)
    public: bool = Field(False, description="Usable by every account (admin keys).")


def finetune_json(staged: Staged, public: bool) -> dict:
    """A finetune as Workers AI lists it; public, whether its adapter is public now."""
    return {
        "id": staged.id,
        "name": staged.name,
        "model": staged.base,
        "description": staged.description,
        "public": public,
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
    staged = await registry_call(
        staging.create, s.registry, caller.tenant, body.name, body.model, body.description,
        body.public, s.limits_of(caller.tenant),
    )  # fmt: skip
    return envelope(finetune_json(staged, body.public))


@router.get("/ai/finetunes", summary="The account's finetunes (Workers AI)")
async def list_finetunes(ctx: Ctx, caller: Caller):
    found = await registry_call(staging.listed, ctx.settings.registry, caller.tenant)
    return envelope([finetune_json(f, public) for f, public in found])


@router.get("/ai/finetunes/public", summary="Public finetunes (Workers AI)")
async def list_public(
    ctx: Ctx,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    order_by: Annotated[str, Query(alias="orderBy", max_length=64)] = "created_at",
):
    if order_by not in ORDER_BY:
        raise ApiError(400, f"orderBy: unknown column {quoted(order_by)}; use "
                            f"{', '.join(ORDER_BY)}")  # fmt: skip
    found = await registry_call(staging.public, ctx.settings.registry)
    rows = sorted((finetune_json(f, True) for f in found), key=lambda r: (r[order_by], r["id"]))
    return envelope(rows[offset : offset + limit])


@router.post("/ai/finetunes/{finetune_id}/finetune-assets", summary="Upload a finetune's file")
async def upload_asset(
    finetune_id: str,
    ctx: Ctx,
    caller: Caller,
    file: Annotated[UploadFile, File(description="The file's bytes.")],
    file_name: Annotated[str, Form(max_length=256, description=" or ".join(staging.ASSETS))],
):
    s = ctx.settings
    data = await file.read()
    staged, warnings = await registry_call(
        staging.receive, s, caller.tenant, finetune_id, file_name, data,
        s.limits_of(caller.tenant),
    )  # fmt: skip
    return envelope(finetune_json(staged, staged.public), messages=warnings)


async def finetune_version(settings: AppSettings, caller: Principal, ref: str) -> Version | None:
    """The version a `lora` naming a finetune by its id runs, None if it names none the
    caller may see (then it is read as an adapter name); 404 for one still missing files."""
    if not UUID_RE.fullmatch(ref):
        return None
    return await registry_call(staging.version_of, settings.registry, caller.tenant, ref,
                               not_found="model_not_found")  # fmt: skip
