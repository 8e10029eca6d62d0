"""OpenAI's Files and Batch API over the batch store: upload a JSONL file, run it as a batch,
read its output and error files. Every id is scoped to the key's tenant: another tenant's id
answers exactly as one that never existed (404)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from adapters.errors import quoted
from serving.api.batch.format import job_of_file, openai_batch, output_file_ids
from serving.api.batch.input import LineBodies, parse_input
from serving.api.batch.results import JSONL, file_chunks, output_lines, output_size
from serving.api.core.batch_store import streamed
from serving.api.core.caller import Principal, authenticate
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.quotas import file_limits
from serving.api.core.text import Metadata, Text
from serving.batch.records import OPENAI, NewItem, StoredFile

router = APIRouter(tags=["OpenAI Batch"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]


def line_bodies(request: Request) -> LineBodies:
    """The body model of each url a batch line may name, as the app was given them."""
    return request.app.state.line_bodies


Bodies = Annotated[LineBodies, Depends(line_bodies)]
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
MAX_LISTED_FILES = 10_000  # OpenAI's own bound and default for a page of files


class BatchCreate(BaseModel):
    """POST /v1/batches."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: Text = Field(..., description="A file uploaded with purpose batch.")
    endpoint: Endpoint = Field(..., description="The route every line's body is for.")
    completion_window: Literal["24h"] = Field("24h", description="Only 24h is offered.")
    metadata: Metadata | None = Field(None, description="Up to 16 key-value pairs.")


@router.post("/v1/files", summary="Upload a batch input file (JSONL)")
async def upload_file(
    ctx: Ctx, caller: Caller, bodies: Bodies, file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
):  # fmt: skip
    if purpose != "batch":
        raise ApiError(400, f"purpose {quoted(purpose)} is not supported; only 'batch' is")
    content = await file.read()
    # Refused now, line by line, rather than at batch time; off the event loop (10 MiB).
    await run_in_threadpool(parse_input, content, bodies)
    quota = file_limits(ctx.settings.limits_of(caller.tenant))
    stored = await ctx.batch.add_file(caller.tenant, purpose, file.filename or "batch.jsonl",
                                      content, **quota)  # fmt: skip
    return _file_object(stored, ctx.settings.batch_ttl_s)


@router.get("/v1/files", summary="The key's tenant's uploaded files, newest first")
async def list_files(
    ctx: Ctx, caller: Caller, purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED_FILES)] = MAX_LISTED_FILES,
    after: str | None = None, order: Literal["asc", "desc"] = "desc",
):  # fmt: skip
    files = await ctx.batch.files(caller.tenant, purpose=purpose, limit=limit + 1, after=after,
                                  ascending=order == "asc")  # fmt: skip
    data = [_file_object(f, ctx.settings.batch_ttl_s) for f in files[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(files) > limit}  # fmt: skip


@router.get("/v1/files/{file_id}", summary="A file's metadata")
async def get_file(file_id: str, ctx: Ctx, caller: Caller):
    stored = await ctx.batch.file(caller.tenant, file_id)
    if stored is not None:
        return _file_object(stored, ctx.settings.batch_ttl_s)
    job = await _output_job(ctx, caller, file_id)
    size = await output_size(ctx.batch, caller.tenant, job, job_of_file(file_id)[1])
    purpose = "batch_output"
    made = StoredFile(file_id, caller.tenant, purpose, f"{file_id}.jsonl", size,
                      job.finished or job.created)  # fmt: skip
    return _file_object(made, ctx.settings.batch_ttl_s)


@router.get("/v1/files/{file_id}/content", summary="A file's content")
async def file_content(file_id: str, ctx: Ctx, caller: Caller):
    # Sent as it is read, a bounded piece at a time: a batch's output can be hundreds of MB.
    stored = await ctx.batch.file(caller.tenant, file_id)
    if stored is not None:
        chunks = file_chunks(ctx.batch, caller.tenant, file_id)
        return await streamed(chunks, JSONL, {"Content-Length": str(stored.bytes)})
    job = await _output_job(ctx, caller, file_id)
    errors = job_of_file(file_id)[1]
    size = job.error_bytes if errors else job.output_bytes  # known once a read counted it
    length = {"Content-Length": str(size)} if size is not None else None
    return await streamed(output_lines(ctx.batch, caller.tenant, job, errors), JSONL, length)


@router.delete("/v1/files/{file_id}", summary="Delete an uploaded file")
async def delete_file(file_id: str, ctx: Ctx, caller: Caller):
    if not await ctx.batch.delete_file(caller.tenant, file_id):
        job = await _output_job(ctx, caller, file_id)  # 404 unless a batch's output or errors
        raise ApiError(
            400, f"{quoted(file_id)} holds results of batch {quoted(job.id)}: it is deleted "
            "with them, batch.ttl_hours after the batch ends",
        )  # fmt: skip
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/v1/batches", summary="Run an uploaded file as a batch")
async def create_batch(body: BatchCreate, ctx: Ctx, caller: Caller, bodies: Bodies):
    content = await ctx.batch.file_content(caller.tenant, body.input_file_id)
    if content is None:
        raise ApiError(404, f"unknown file {quoted(body.input_file_id)}")
    lines = await run_in_threadpool(parse_input, content, bodies)
    wrong = [line for line in lines if line.url != body.endpoint]
    if wrong:
        raise ApiError(400, f"line {wrong[0].line} of the file is for {wrong[0].url}, "
                            f"not the batch's endpoint {body.endpoint}")  # fmt: skip
    job = await ctx.batch.submit(
        tenant=caller.tenant, key_id=caller.key_id, model=ctx.settings.model_id, api=OPENAI,
        endpoint=body.endpoint, items=[NewItem(line.body, line.custom_id) for line in lines],
        input_file_id=body.input_file_id, metadata=body.metadata,
        max_pending=ctx.settings.limits_of(caller.tenant).get("batch_queued_requests"),
    )  # fmt: skip
    return openai_batch(job)


@router.get("/v1/batches/{batch_id}", summary="A batch and its progress")
async def get_batch(batch_id: str, ctx: Ctx, caller: Caller):
    return openai_batch(await _job(ctx, caller, batch_id))


@router.get("/v1/batches", summary="The key's tenant's batches, newest first")
async def list_batches(
    ctx: Ctx, caller: Caller, limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
):  # fmt: skip
    jobs = await ctx.batch.jobs(caller.tenant, limit=limit + 1, after=after)
    data = [openai_batch(job) for job in jobs[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(jobs) > limit}  # fmt: skip


@router.post("/v1/batches/{batch_id}/cancel", summary="Stop a batch; finished items are kept")
async def cancel_batch(batch_id: str, ctx: Ctx, caller: Caller):
    job = await ctx.batch.cancel(caller.tenant, batch_id)
    if job is None:
        raise ApiError(404, f"unknown batch {quoted(batch_id)}")
    return openai_batch(job)


async def _job(ctx: ApiContext, caller: Principal, batch_id: str):
    job = await ctx.batch.job(caller.tenant, batch_id)
    if job is None:
        raise ApiError(404, f"unknown batch {quoted(batch_id)}")
    return job


async def _output_job(ctx: ApiContext, caller: Principal, file_id: str):
    """The batch whose output or error file file_id is; 404 when it is no such file."""
    found = job_of_file(file_id)
    job = await ctx.batch.job(caller.tenant, found[0]) if found else None
    if job is None or file_id not in output_file_ids(job):
        raise ApiError(404, f"unknown file {quoted(file_id)}")
    return job


def _file_object(f: StoredFile, ttl_s: float) -> dict:
    # The store deletes a file ttl_s after it was made (a batch's results, after it ended),
    # once no open batch reads it.
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": int(f.created),
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": int(f.created + ttl_s), "status_details": None}  # fmt: skip
