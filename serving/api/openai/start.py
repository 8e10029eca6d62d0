"""What the OpenAI routes share to start a body's generations: its adapter (by `model` or
`lora`, see serving.api.core.resolve), its sampling fields, and its choices started together."""

from __future__ import annotations

from dataclasses import replace

from fastapi import Request

from adapters.registry.records import Version
from serving.api.core.caller import Principal
from serving.api.core.choices import start_all
from serving.api.core.context import ApiContext
from serving.api.core.errors import ApiError
from serving.api.core.generation import cache_salt, start, start_terms
from serving.api.core.metering import PromptBill, check_choices_fit
from serving.api.core.prompts import sampling
from serving.api.core.queued_call import queued_call
from serving.api.core.resolve import (
    adapter_from_lora,
    adapter_from_model,
    pick_adapter,
    resolve_version,
)
from serving.api.core.response_format import engine_format
from serving.engine.request import GenerateRequest


async def start_choices(
    ctx, caller, request, body, rid, prompts, params, version, t0, constraint=None
) -> list:
    """One generation per choice, started together: prompt p's j-th of n is choice p*n + j,
    with seed + j when a seed is given, so the choices differ yet repeat. A prompt is
    billed once, with its first choice. constraint: the output's shape (tool calls), in
    place of the body's response_format."""
    salt, who, n = cache_salt(ctx, caller), start_terms(request, t0, version), body.n
    requests = []
    for p, ids in enumerate(prompts):
        for j in range(n):
            rid_ = rid if len(prompts) * n == 1 else f"{rid}-{p * n + j}"
            seeded = (
                params if params.seed is None else replace(params, seed=(params.seed + j) % 2**63)
            )
            requests.append(_request(rid_, ids, seeded, version, salt, body, constraint))
    check_choices_fit(ctx, caller, requests)
    bills = [PromptBill() if n > 1 else None for _ in prompts]
    return await start_all([
        start(ctx, r, caller=caller, prompt_bill=bills[k // n], first_choice=k % n == 0, **who)
        for k, r in enumerate(requests)
    ])  # fmt: skip


def one_per_queued_item(request: Request, prompts: int, n: int) -> None:
    # A queued item's answer is metered as one record; its sender splits the rest into lines.
    if (prompts > 1 or n > 1) and queued_call(request) is not None:
        raise ApiError(400, "a batch line asks for one choice: one prompt, n 1; give each "
                            "its own line")  # fmt: skip


def sampling_for(body, settings):
    """SamplingParams of a chat or text completion body (OpenAI's default temperature 1)."""
    params = sampling(
        body,
        settings,
        max_tokens=body.output_limit(),
        default_temperature=1.0,
        stop=body.stop_strings(),
        logprobs=body.num_logprobs(),
    )
    return replace(params, prompt_logprobs=body.num_prompt_logprobs())


def _request(
    rid, ids, params, version: Version | None, salt: str | None, body, constraint=None
) -> GenerateRequest:
    return GenerateRequest(
        rid, tuple(ids), params, version and version.qualified, cache_salt=salt,
        response_format=constraint or engine_format(body.response_format),
    )  # fmt: skip


async def version_for(ctx: ApiContext, caller: Principal, body) -> Version | None:
    s = ctx.settings
    from_lora = adapter_from_lora(s, body.lora) if body.lora is not None else None
    ref = pick_adapter(adapter_from_model(s, body.model), from_lora)
    return await resolve_version(s, caller, ref)
