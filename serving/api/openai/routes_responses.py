"""POST /v1/responses: OpenAI's Responses API over the chat path, stateless.

The body becomes a chat (serving.api.openai.responses_schemas) served as /v1/chat/completions
serves one choice: the same adapter choice by `model` or `lora`, limits, metering, prefix
cache and constrained output (`text.format`). The answer is a response object, or with
`stream` its events (serving.api.openai.responses_format).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from serving.api.core.caller import Principal, authenticate
from serving.api.core.choices import collect_all, merged
from serving.api.core.context import ApiContext, api_context
from serving.api.core.errors import ApiError
from serving.api.core.generation import Generation, answer, new_id
from serving.api.core.metering import fitted_to_token_limit
from serving.api.core.prompts import chat_ids
from serving.api.core.queued_call import queued_call
from serving.api.core.settings import AppSettings
from serving.api.core.sse import event_stream
from serving.api.core.tools import template_tools, tool_plan
from serving.api.openai import format as fmt
from serving.api.openai.responses_calls import tool_events
from serving.api.openai.responses_format import (
    ResponseView,
    failed_events,
    final_status,
    function_call,
    response_usage,
)
from serving.api.openai.responses_schemas import ResponsesRequest
from serving.api.openai.start import sampling_for, start_choices, version_for

router = APIRouter(tags=["OpenAI"])
Ctx = Annotated[ApiContext, Depends(api_context)]
Caller = Annotated[Principal, Depends(authenticate)]


@router.post("/v1/responses", summary="Response (OpenAI's Responses API; nothing is stored)")
async def responses(body: ResponsesRequest, request: Request, ctx: Ctx, caller: Caller):
    t0, s = time.perf_counter(), ctx.settings
    version = await version_for(ctx, caller, body)
    params = sampling_for(body, s)
    tools = body.chat_tools()
    plan = tool_plan(s, tools, body.chat_tool_choice(), body.parallel_tool_calls)
    rid = new_id("resp").replace("-", "_")
    ids = await _prompt_ids(s, body, template_tools(tools))
    if body.output_limit() is None and queued_call(request) is None:
        params = fitted_to_token_limit(ctx, caller, params, len(ids), choices=1)
    gens = await start_choices(ctx, caller, request, body, rid, [ids], params, version, t0,
                               constraint=plan.constraint if plan else None)  # fmt: skip
    view = ResponseView(rid, new_id("msg").replace("-", "_"), fmt.now(), body)
    if body.stream:
        events = tool_events(gens[0], view, plan) if plan else _events(ctx, gens[0], view)
        return event_stream(gens, events, s.send_timeout_s)
    [outcome] = await collect_all(gens, request)
    logprobs = _logprobs(ctx, body, outcome.logprobs)
    usage = response_usage(outcome.prompt_tokens, outcome.completion_tokens,
                           outcome.cached_tokens)  # fmt: skip
    status = final_status(outcome.finish_reason)
    text, calls = plan.read(outcome.text) if plan else (outcome.text, [])
    items = [function_call(c.name, c.arguments, plan.call_id()) for c in calls]
    if calls and text is None:
        logprobs = None  # no message to carry them
    return answer(gens[0], view.response(status, text, outcome.finish_reason, usage,
                                         logprobs, calls=items))  # fmt: skip


async def _prompt_ids(
    settings: AppSettings, body: ResponsesRequest, tools: list[dict] | None
) -> list[int]:
    """The chat's token ids, the functions of tools offered. With truncation "auto", as
    OpenAI's, the fewest oldest turns go (system turns stay; the last turn never goes) for
    the rest to leave room for output."""
    turns = body.messages()
    try:
        return await chat_ids(settings, turns, field="input", tools=tools)
    except ApiError as exc:
        if body.truncation != "auto" or exc.code != "context_length_exceeded":
            raise
        failure = exc
    # Turns that may go, oldest first (a developer turn is a system turn by now)
    spare = [k for k, t in enumerate(turns[:-1]) if t.role != "system"]

    def without(n: int) -> list:
        return [t for k, t in enumerate(turns) if k not in spare[:n]]

    # Bisect on how many go: dropping more never lengthens the prompt, so O(log turns)
    # renderings find the fewest, where dropping one at a time would take O(turns).
    lo, hi, found = 1, len(spare), None
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            found = await chat_ids(settings, without(mid), field="input", tools=tools)
            hi = mid - 1
        except ApiError as exc:
            if exc.code != "context_length_exceeded":
                raise
            lo = mid + 1
    if found is None:
        raise failure
    return found


def _logprobs(ctx: ApiContext, body: ResponsesRequest, logprobs) -> list | None:
    if body.num_logprobs() is None:
        return None
    return fmt.chat_logprobs(ctx.settings.tokenizer, logprobs)["content"]


async def _events(ctx: ApiContext, gen: Generation, view: ResponseView) -> AsyncIterator[dict]:
    yield view.event("response.created", response=view.response("in_progress"))
    yield view.event("response.in_progress", response=view.response("in_progress"))
    yield view.event("response.output_item.added", output_index=0, item=view.message("", None))
    yield view.text_event("response.content_part.added", part=view.part(""))
    text, logprobs, last = [], [], None
    async with contextlib.aclosing(merged([gen])) as outputs:  # closed when the stream is
        async for _, out in outputs:
            if out.finish_reason == "error":
                for event in failed_events(view, out):
                    yield event
                return
            lp = _logprobs(ctx, view.body, out.logprobs)
            if out.new_text or lp:
                text.append(out.new_text)
                logprobs += lp or []
                yield view.text_event("response.output_text.delta", delta=out.new_text,
                                      logprobs=lp or [])  # fmt: skip
            if out.finished:
                last = out
    if last is None:  # the stream was closed first
        return
    whole, lps = "".join(text), logprobs if view.body.num_logprobs() is not None else None
    yield view.text_event("response.output_text.done", text=whole, logprobs=lps or [])
    yield view.text_event("response.content_part.done", part=view.part(whole, lps))
    item = view.message(whole, last.finish_reason, lps)
    yield view.event("response.output_item.done", output_index=0, item=item)
    usage = response_usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
    status = final_status(last.finish_reason)
    final = view.response(status, whole, last.finish_reason, usage, lps)
    yield view.event(f"response.{status}", response=final)
