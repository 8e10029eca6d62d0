"""POST /ai/run/{model}: Cloudflare Workers-AI shaped text generation.

`model` must be the served model's id; the adapter comes from `lora` (a name, or a
finetune's id: serving.api.workers_ai.finetunes). A `prompt` is
wrapped by the chat template as one user turn unless `raw`; `messages` always are.
Streams are server-sent events `data: {"response": "..."}`, the last carrying `usage`,
then `data: [DONE]`. With ?queueRequest=true the body's `requests` are queued as one batch
(answered with its request_id at once); a body of `request_id` alone polls that batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from adapters.errors import quoted
from serving.api.core.batch_store import streamed
from serving.api.core.caller import Principal, authenticate
from serving.api.core.choices import collect_all
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.generation import (
    DONE,
    Generation,
    answer,
    cache_salt,
    failed_stream_end,
    new_id,
    start,
    start_terms,
)
from serving.api.core.messages import ChatMessage
from serving.api.core.prompts import chat_ids, sampling, text_ids
from serving.api.core.resolve import adapter_from_lora, resolve_version
from serving.api.core.response_format import engine_format
from serving.api.core.sse import event_stream
from serving.api.core.tool_deltas import ToolDeltas
from serving.api.core.tools import ToolPlan, template_tools, tool_plan
from serving.api.workers_ai.envelope import envelope
from serving.api.workers_ai.finetunes import finetune_version
from serving.api.workers_ai.queued import workers_poll, workers_status
from serving.api.workers_ai.schemas import WorkersAIRequest
from serving.batch.records import WORKERS_AI, NewItem
from serving.engine.request import GenerateRequest, RequestOutput

router = APIRouter(tags=["Workers AI"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]
DEFAULT_MAX_TOKENS = 256  # Workers AI's default
DEFAULT_TEMPERATURE = 0.6  # Workers AI's default


QueueFlag = Annotated[
    bool, Query(alias="queueRequest", description="Queue `requests` as a batch, answer at once.")
]


@router.post("/ai/run/{model:path}", summary="Run the model (Workers AI)")
async def run(
    model: str, body: WorkersAIRequest, request: Request, ctx: Ctx, caller: Caller,
    queue: QueueFlag = False,
):  # fmt: skip
    t0, s = time.perf_counter(), ctx.settings
    if model != s.model_id:
        raise ApiError(404, f"unknown model {quoted(model)}; this server serves {s.model_id!r}")
    if queue or body.requests is not None:
        return await _queue(model, body, ctx, caller, queue)
    if body.request_id is not None:
        return await _poll(body.request_id, ctx, caller)
    ref = adapter_from_lora(s, body.lora) if body.lora is not None else None
    by_id = await finetune_version(s, caller, ref) if ref is not None else None
    version = by_id or await resolve_version(s, caller, ref)  # a finetune's id, else a name
    tools = body.chat_tools()
    plan = tool_plan(s, tools, None, None)  # Workers AI's tools: the model may call them
    offered = template_tools(tools)
    if body.messages is not None:
        ids = await chat_ids(s, body.messages, tools=offered)
    elif body.raw:
        ids = await text_ids(s, body.prompt)
    else:
        turn = ChatMessage(role="user", content=body.prompt)
        ids = await chat_ids(s, [turn], "prompt", tools=offered)
    params = sampling(
        body,
        s,
        max_tokens=body.max_tokens or DEFAULT_MAX_TOKENS,
        default_temperature=DEFAULT_TEMPERATURE,
    )
    request_id = new_id("ai")
    gen = await start(
        ctx,
        GenerateRequest(
            request_id,
            tuple(ids),
            params,
            version and version.qualified,
            cache_salt=cache_salt(ctx, caller),
            response_format=plan.constraint if plan else engine_format(body.response_format),
        ),
        caller=caller,
        **start_terms(request, t0, version),
    )
    if body.stream:
        return event_stream(gen, _events(gen, plan), s.send_timeout_s)
    [outcome] = await collect_all([gen], request)
    usage = _usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
    result = {"response": outcome.text, "usage": usage}
    if plan is not None:  # Workers AI's shape: the text beside the calls, arguments as objects
        text, calls = plan.read(outcome.text)
        result.update(response=text, tool_calls=[_call(c.name, c.arguments) for c in calls])
    return answer(gen, envelope(result))


async def _queue(model: str, body: WorkersAIRequest, ctx: ApiContext, caller: Principal, queue):
    """Store the batch (committed before the answer); its request_id to poll."""
    if not queue:
        raise ApiError(400, "requests queues a batch: send it with ?queueRequest=true")
    if body.requests is None:
        raise ApiError(400, 'queueRequest=true needs a body of {"requests": [...]}')
    for i, item in enumerate(body.requests):  # a malformed lora is refused now, not when run
        try:
            adapter_from_lora(ctx.settings, item.lora) if item.lora is not None else None
        except ApiError as exc:
            raise ApiError(exc.status, f"requests.{i}.{exc.message}", exc.code) from None
    items = [
        NewItem(item.model_dump(exclude_unset=True, exclude={"external_reference"}),
                item.external_reference)
        for item in body.requests
    ]  # fmt: skip
    most = ctx.settings.limits_of(caller.tenant).get("batch_queued_requests")
    job = await ctx.batch.submit(tenant=caller.tenant, key_id=caller.key_id, model=model,
                                 api=WORKERS_AI, endpoint="/ai/run", items=items,
                                 max_pending=most)  # fmt: skip
    result = {"status": "queued", "request_id": job.id, "model": model}
    return envelope(result)


async def _poll(request_id: str, ctx: ApiContext, caller: Principal):
    """The batch's progress, or its responses once every item has ended."""
    job = await ctx.batch.job(caller.tenant, request_id)
    if job is None:  # another tenant's id reads exactly as one never issued
        raise ApiError(404, f"unknown batch request {quoted(request_id)}")
    if job.api != WORKERS_AI:  # its lines answer in OpenAI's shape, which this one cannot carry
        raise ApiError(
            400, f"{quoted(request_id)} is an OpenAI batch: read it with GET "
            f"/v1/batches/{request_id} and its output file",
        )  # fmt: skip
    if job.finished is not None:  # every response, sent a page at a time as it is read
        return await streamed(workers_poll(ctx.batch, caller.tenant, job), "application/json")
    return envelope(workers_status(job))


async def _events(gen: Generation, plan: ToolPlan | None) -> AsyncIterator[str]:
    """{"response": text} events, the last with usage; with tools, text that is a call is
    held, and the calls go out whole with the last event."""
    reader, calls = ToolDeltas(plan) if plan else None, {}
    async for out in gen:
        if out.finish_reason == "error":
            for event in failed_stream_end("/ai/run", out):
                yield event
            return
        text = out.new_text
        if reader is not None:
            deltas = reader.deltas(text) + (reader.end() if out.finished else [])
            text = "".join(d.get("content", "") for d in deltas)
            for d in deltas:
                for call in d.get("tool_calls", ()):
                    got = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                    got["name"] += call["function"].get("name") or ""
                    got["arguments"] += call["function"]["arguments"]
        if text and not out.finished:
            yield json.dumps({"response": text})
        if out.finished:
            last = {"response": text, "usage": _output_usage(out)}
            if reader is not None:
                last["tool_calls"] = [_call(c["name"], c["arguments"]) for c in calls.values()]
            yield json.dumps(last)
    yield DONE


def _call(name: str, arguments: str) -> dict:
    """A call as Workers AI answers it: its arguments an object (text that is no JSON, from
    a call cut short, stays text)."""
    try:
        return {"name": name, "arguments": json.loads(arguments)}
    except ValueError:
        return {"name": name, "arguments": arguments}


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "cached_tokens": cached_tokens,
    }


def _output_usage(out: RequestOutput) -> dict:
    return _usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
