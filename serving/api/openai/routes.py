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
from dataclasses import replace
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
from serving.api.core.tool_deltas import ToolDeltas
from serving.api.core.tools import ToolPlan, template_tools, tool_plan
from serving.api.openai import format as fmt
from serving.api.openai.echo import PromptPart, chat_extras, joined
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
    plan = tool_plan(s, body.tools, body.tool_choice, body.parallel_tool_calls)
    rid = new_id("chatcmpl")
    one_per_queued_item(request, 1, body.n)
    ids = await chat_ids(s, body.messages, tools=template_tools(body.tools))
    if body.output_limit() is None and queued_call(request) is None:  # (queued items: no limits)
        params = fitted_to_token_limit(ctx, caller, params, len(ids), choices=body.n)
    constraint = plan.constraint if plan else None
    gens = await start_choices(ctx, caller, request, body, rid, [ids], params, version, t0,
                               constraint=constraint)  # fmt: skip
    if body.stream:
        return event_stream(gens, _chat_events(ctx, gens, rid, body, plan), s.send_timeout_s)
    outcomes = await collect_all(gens, request)
    logprobs = [
        fmt.chat_logprobs(s.tokenizer, o.logprobs) if body.logprobs else None for o in outcomes
    ]
    content = fmt.chat_completion(rid, body.model, outcomes, logprobs, body.n, plan)
    return answer(gens[-1], content | chat_extras(s.tokenizer, body, outcomes))


@router.post("/v1/completions", summary="Text completion")
async def completions(body: CompletionRequest, request: Request, ctx: Ctx, caller: Caller):
    t0, s = time.perf_counter(), ctx.settings
    version = await version_for(ctx, caller, body)
    params = sampling_for(body, s)
    rid, prompts = new_id("cmpl"), body.prompts()
    one_per_queued_item(request, len(prompts), body.n)
    ids = [await text_ids(s, p) if isinstance(p, str) else given_ids(s, p) for p in prompts]
    gens = await start_choices(ctx, caller, request, body, rid, ids, params, version, t0)
    part = PromptPart(s.tokenizer, body, prompts, ids)
    if body.stream:
        events = _completion_events(ctx, gens, rid, body, part)
        return event_stream(gens, events, s.send_timeout_s)
    outcomes = await collect_all(gens, request)
    logprobs = []
    for k, o in enumerate(outcomes):
        offsets = fmt.TextOffsets()  # the prompt's tokens first, with echo
        head = part.logprobs(k, o.prompt_logprobs, offsets)
        tail = fmt.completion_logprobs(s.tokenizer, o.logprobs, offsets)
        logprobs.append(None if body.logprobs is None else joined(head, tail) if head else tail)
    shown = [replace(o, text=part.text(k) + o.text) for k, o in enumerate(outcomes)]
    content = fmt.text_completion(rid, body.model, shown, logprobs, body.n)
    for choice, o in zip(content["choices"], outcomes, strict=True):
        choice.update(part.extras(o.prompt_logprobs))
    return answer(gens[-1], content)


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
    ctx: ApiContext,
    gens: list[Generation],
    rid: str,
    body: ChatCompletionRequest,
    plan: ToolPlan | None,
) -> AsyncIterator[str]:
    created, tokenizer = fmt.now(), ctx.settings.tokenizer
    extra = {"usage": None} if body.include_usage() else {}
    last: dict[int, RequestOutput] = {}
    readers = [ToolDeltas(plan) for _ in gens] if plan else None

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
            lp = fmt.chat_logprobs(tokenizer, out.logprobs) if body.logprobs else None
            if readers is None:
                if out.new_text or (body.logprobs and out.logprobs):
                    yield chunk(k, {"content": out.new_text}, logprobs=lp)
            else:  # text read into content and calls; logprobs ride with the first delta
                deltas = readers[k].deltas(out.new_text) + (readers[k].end() if out.finished
                                                             else [])  # fmt: skip
                if not deltas and body.logprobs and out.logprobs:
                    deltas = [{"content": ""}]
                for j, delta in enumerate(deltas):
                    yield chunk(k, delta, logprobs=lp if j == 0 else None)
            if out.finished:
                last[k] = out
                reason = fmt.finish_reason(out.finish_reason)
                if readers and readers[k].calls and reason == "stop":
                    reason = "tool_calls"
                yield chunk(k, {}, reason)
    if body.include_usage():
        usage = fmt.summed_usage(last, body.n)
        yield json.dumps(fmt.chat_chunk(rid, created, body.model, [], usage=usage))
    yield DONE


async def _completion_events(
    ctx: ApiContext, gens: list[Generation], rid: str, body: CompletionRequest, part: PromptPart
) -> AsyncIterator[str]:
    created, tokenizer = fmt.now(), ctx.settings.tokenizer
    offsets = [fmt.TextOffsets() for _ in gens]  # each choice's own
    extra = {"usage": None} if body.include_usage() else {}
    last: dict[int, RequestOutput] = {}
    opened: set[int] = set()

    def chunk(k: int, text: str, reason: str | None = None, logprobs=None) -> str:
        choice = {"index": k, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return json.dumps(fmt.completion_chunk(rid, created, body.model, [choice], **extra))

    async with contextlib.aclosing(merged(gens)) as outputs:
        async for k, out in outputs:
            if out.finish_reason == "error":
                for event in failed_stream_end("/v1", out):
                    yield event
                return
            if body.echo and k not in opened:  # the prompt first, as vLLM streams an echo
                opened.add(k)
                yield chunk(k, part.text(k), logprobs=part.logprobs(k, out.prompt_logprobs,
                                                                    offsets[k]))  # fmt: skip
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
