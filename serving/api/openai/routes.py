"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

The adapter is chosen by `model` ("<adapter>", "<model.id>:<adapter>"; model.id alone is
the base model) or by the extra `lora` field (serving.api.core.resolve). Streams are
server-sent events of chunks ending with `data: [DONE]`; errors are OpenAI's {"error": ...}.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from adapters.errors import AdapterError, quoted
from serving.api.core.adapter_errors import adapter_http_error
from serving.api.core.caller import Principal, authenticate
from serving.api.core.choices import collect_all, merged
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.generation import DONE, Generation, answer, failed_stream_end, new_id
from serving.api.core.metering import fitted_to_token_limit
from serving.api.core.prompts import chat_ids, given_ids, text_ids
from serving.api.core.queued_call import queued_call
from serving.api.core.resolve import (
    adapter_from_model,
)
from serving.api.core.sse import event_stream
from serving.api.openai import format as fmt
from serving.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from serving.api.openai.start import one_per_queued_item, sampling_for, start_choices, version_for
from serving.engine.request import RequestOutput

router = APIRouter(tags=["OpenAI"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]


@router.post("/v1/chat/completions", summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Ctx, caller: Caller):
    t0, s = time.perf_counter(), ctx.settings
    version = await version_for(ctx, caller, body)
    params = sampling_for(body, s)
    rid = new_id("chatcmpl")
    one_per_queued_item(request, 1, body.n)
    ids = await chat_ids(s, body.messages)
    if body.output_limit() is None and queued_call(request) is None:  # (queued items: no limits)
        params = fitted_to_token_limit(ctx, caller, params, len(ids), choices=body.n)
    gens = await start_choices(ctx, caller, request, body, rid, [ids], params, version, t0)
    if body.stream:
        return event_stream(gens, _chat_events(ctx, gens, rid, body), s.send_timeout_s)
    outcomes = await collect_all(gens, request)
    logprobs = [
        fmt.chat_logprobs(s.tokenizer, o.logprobs) if body.logprobs else None for o in outcomes
    ]
    return answer(gens[-1], fmt.chat_completion(rid, body.model, outcomes, logprobs, body.n))


@router.post("/v1/completions", summary="Text completion")
async def completions(body: CompletionRequest, request: Request, ctx: Ctx, caller: Caller):
    t0, s = time.perf_counter(), ctx.settings
    version = await version_for(ctx, caller, body)
    params = sampling_for(body, s)
    rid, prompts = new_id("cmpl"), body.prompts()
    one_per_queued_item(request, len(prompts), body.n)
    ids = [await text_ids(s, p) if isinstance(p, str) else given_ids(s, p) for p in prompts]
    gens = await start_choices(ctx, caller, request, body, rid, ids, params, version, t0)
    if body.stream:
        return event_stream(gens, _completion_events(ctx, gens, rid, body), s.send_timeout_s)
    outcomes = await collect_all(gens, request)
    logprobs = [
        fmt.completion_logprobs(s.tokenizer, o.logprobs) if body.logprobs is not None else None
        for o in outcomes
    ]
    return answer(gens[-1], fmt.text_completion(rid, body.model, outcomes, logprobs, body.n))


@router.get("/v1/models", summary="The base model and the adapters this key may use")
async def models(ctx: Ctx, caller: Caller):
    # What `model` may name: the caller's tenant's adapters and the public ones, for admin
    # keys too (GET /v1/adapters lists every tenant's to them).
    s = ctx.settings
    try:
        entries = await run_in_threadpool(s.registry.list_visible, caller.tenant)
    except AdapterError as exc:
        raise adapter_http_error(exc) from None
    base = _card(s.model_id, 0, s.owned_by, None, s.model_id)
    adapters = [
        _card(f"{s.model_id}:{e.name}", _epoch(e.updated), e.owner, s.model_id, s.model_id)
        for e in entries
    ]
    return {"object": "list", "data": [base, *adapters]}


@router.get("/v1/models/{model:path}", summary="One model the key may use, as /v1/models lists it")
async def model_card(model: str, ctx: Ctx, caller: Caller):
    s = ctx.settings
    if model == s.model_id:
        return _card(s.model_id, 0, s.owned_by, None, s.model_id)
    name = adapter_from_model(s, model)  # 404 for another base or a malformed name
    try:
        entries = await run_in_threadpool(s.registry.list_visible, caller.tenant)
    except AdapterError as exc:
        raise adapter_http_error(exc) from None
    for e in entries:
        if e.name == name:
            return _card(f"{s.model_id}:{e.name}", _epoch(e.updated), e.owner, s.model_id,
                         s.model_id)  # fmt: skip
    raise ApiError(404, f"the model {quoted(model)} does not exist", code="model_not_found")


async def _chat_events(
    ctx: ApiContext, gens: list[Generation], rid: str, body: ChatCompletionRequest
) -> AsyncIterator[str]:
    created, tokenizer = fmt.now(), ctx.settings.tokenizer
    extra = {"usage": None} if body.include_usage() else {}
    last: dict[int, RequestOutput] = {}

    def chunk(k: int, delta: dict, reason: str | None = None, logprobs=None) -> str:
        choice = {"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return json.dumps(fmt.chat_chunk(rid, created, body.model, [choice], **extra))

    for k in range(len(gens)):  # each choice opens with its role, as OpenAI's stream does
        yield chunk(k, {"role": "assistant", "content": ""})
    async with contextlib.aclosing(merged(gens)) as outputs:  # closed when the stream is
        async for k, out in outputs:
            if out.finish_reason == "error":
                for event in failed_stream_end("/v1", out):
                    yield event
                return
            if out.new_text or (body.logprobs and out.logprobs):
                lp = fmt.chat_logprobs(tokenizer, out.logprobs) if body.logprobs else None
                yield chunk(k, {"content": out.new_text}, logprobs=lp)
            if out.finished:
                last[k] = out
                yield chunk(k, {}, fmt.finish_reason(out.finish_reason))
    if body.include_usage():
        usage = fmt.summed_usage(last, body.n)
        yield json.dumps(fmt.chat_chunk(rid, created, body.model, [], usage=usage))
    yield DONE


async def _completion_events(
    ctx: ApiContext, gens: list[Generation], rid: str, body: CompletionRequest
) -> AsyncIterator[str]:
    created, tokenizer = fmt.now(), ctx.settings.tokenizer
    offsets = [fmt.TextOffsets() for _ in gens]  # each choice's own
    extra = {"usage": None} if body.include_usage() else {}
    last: dict[int, RequestOutput] = {}

    def chunk(k: int, text: str, reason: str | None = None, logprobs=None) -> str:
        choice = {"index": k, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return json.dumps(fmt.completion_chunk(rid, created, body.model, [choice], **extra))

    async with contextlib.aclosing(merged(gens)) as outputs:
        async for k, out in outputs:
            if out.finish_reason == "error":
                for event in failed_stream_end("/v1", out):
                    yield event
                return
            if out.new_text or (body.logprobs is not None and out.logprobs):
                lp = None
                if body.logprobs is not None:
                    lp = fmt.completion_logprobs(tokenizer, out.logprobs, offsets[k])
                yield chunk(k, out.new_text, logprobs=lp)
            if out.finished:
                last[k] = out
                yield chunk(k, "", fmt.finish_reason(out.finish_reason))
    if body.include_usage():
        usage = fmt.summed_usage(last, body.n)
        yield json.dumps(fmt.completion_chunk(rid, created, body.model, [], usage=usage))
    yield DONE


def _card(model: str, created: int, owned_by: str, parent: str | None, root: str) -> dict:
    return {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": root,
        "parent": parent,
    }


def _epoch(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0
