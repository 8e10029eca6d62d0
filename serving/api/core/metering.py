"""Who pays for a request: its admission under its tenant's rate limits, and its usage record.

A request is admitted (only when a limit applies to its tenant) before it starts, and when it
ends (finished, or left by its client) its usage is recorded and its admission released,
charging what it used. A queued item is neither admitted nor recorded here: its record is
left on its QueuedCall, and the feeder meters it once the item's result is committed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

from adapters.registry.names import version_label
from serving.api.core.caller import Principal
from serving.api.core.context import ApiContext
from serving.api.core.errors import ApiError
from serving.api.core.queued_call import QueuedCall
from serving.api.core.tenancy import rate_limited
from serving.engine.request import GenerateRequest, RequestOutput, SamplingParams
from serving.usage.limits import Admission, RateLimited
from serving.usage.record import UsageRecord

RETRY_AFTER_SECONDS = 1
# Admission and usage records wait at most this for the tenancy (a Ray deployment may be
# restarting): past it a request is refused with 503; a record is kept to be sent again
# (HandleTenancy's outbox, before this has passed), and logged as lost only if it cannot be.
TENANCY_TIMEOUT_S = 10.0
log = logging.getLogger("loraserve.api")


@dataclass
class PromptBill:
    """Which of a prompt's n choices bills it, as OpenAI bills n choices' prompt once: the
    first, unless it fails; then the next of the others to end."""

    open: bool = False  # the first choice failed: the prompt goes to the next to end
    taken: bool = False

    def take(self, first: bool, out: RequestOutput) -> bool:
        """Whether the choice that ended with out bills the prompt (asked once a choice)."""
        if out.finish_reason == "error":
            self.open = self.open or first
            return False
        if first or (self.open and not self.taken):
            self.taken = True
            return True
        return False


@dataclass(frozen=True)
class Meter:
    """Whose request it is, for its usage record and its admission's release."""

    caller: Principal
    adapter: str | None  # the qualified version, None for the base model
    kind: str = "interactive"  # | "batch"
    admission: Admission | None = None
    # A queued item's: its record is left here, metered by the feeder after the commit.
    sink: QueuedCall | None = None
    variants: tuple[str, ...] = ()  # the adapter's LoRA variants (Version.variants)
    # One of a prompt's n choices (n > 1): the prompt is billed once among them.
    prompt_bill: PromptBill | None = None
    first_choice: bool = True

    @property
    def headers(self) -> dict[str, str]:
        """The x-ratelimit-* headers of the answer."""
        return dict(self.admission.headers) if self.admission else {}

    def record(self, out: RequestOutput | None, prompt: int, cached: int) -> UsageRecord | None:
        """The usage record of a request that ran (out: the last output its answer got to):
        one that finished (stop or length), with the usage its answer carried; one whose
        client left before the end (an abort), with the tokens sent by then, as OpenAI
        bills a cancelled stream; each with the prompt and cached tokens it bills
        (prompt_of). A failed or refused one is not metered."""
        if out is None or out.finish_reason == "error":
            return None
        return UsageRecord(
            tenant=self.caller.tenant,
            key_id=self.caller.key_id,
            adapter=version_label(self.adapter) if self.adapter else "base",
            kind=self.kind,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=out.completion_tokens,
            time=time.time(),
        )

    def prompt_of(self, out: RequestOutput) -> tuple[int, int]:
        """(prompt tokens, cached tokens) this request bills; asked once, as it ends."""
        if self.prompt_bill is None or self.prompt_bill.take(self.first_choice, out):
            return out.prompt_tokens, out.cached_tokens
        return 0, 0


def fitted_to_token_limit(
    ctx: ApiContext, caller: Principal, sampling: SamplingParams, prompt_tokens: int,
    choices: int = 1,
) -> SamplingParams:  # fmt: skip
    """sampling of a request that set no max_tokens, its output capped so that prompt and
    output, once per choice, fit caller's tenant's tokens_per_minute. Uncapped, it would
    reserve the whole context, which a smaller limit never admits: the most common chat
    call would be refused forever. (A request whose prompts alone are larger is refused as
    too large.)"""
    most = ctx.settings.limits_of(caller.tenant).get("tokens_per_minute")
    room = None if most is None else most // choices - prompt_tokens
    if room is None or room < 1:
        return sampling
    return dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room))


def check_choices_fit(ctx: ApiContext, caller: Principal, requests: list[GenerateRequest]) -> None:
    """A 429 with no Retry-After (as for one request larger than a limit) when the choices of
    one answer, each admitted on its own, could never all be: more than the tenant may run
    at once or in a minute, or tokens past its minute's. No wait would let them in."""
    limits = ctx.settings.limits_of(caller.tenant)
    count = len(requests)
    if count < 2:
        return
    tokens = sum(_reserved(ctx, r) for r in requests)
    for name, asked in (("concurrent_requests", count), ("requests_per_minute", count),
                        ("tokens_per_minute", tokens)):  # fmt: skip
        most = limits.get(name)
        if most is not None and asked > most:
            what = f"{asked} tokens" if name == "tokens_per_minute" else f"{asked} requests"
            raise ApiError(429, f"this request's {count} choices (prompts x n) need {what} at "
                                f"once, larger than this tenant's {name} limit of {most}; ask "
                                "for fewer choices or fewer tokens", code="rate_limit_exceeded")  # fmt: skip


def _reserved(ctx: ApiContext, request: GenerateRequest) -> int:
    # The engine stops a sequence at max_model_len, prompt included: no request uses more.
    prompt = len(request.prompt_token_ids)
    return min(prompt + request.sampling.max_tokens, max(ctx.settings.max_model_len, prompt))


async def admit(ctx: ApiContext, caller: Principal, request: GenerateRequest) -> Admission | None:
    """caller's tenant's admission for request, reserving its prompt and max_tokens; None
    when no rate limit applies to the tenant; 429 with OpenAI's headers when one is hit."""
    if not rate_limited(ctx.settings.limits_of(caller.tenant)):
        return None
    tokens = _reserved(ctx, request)
    # Its own task: a caller cancelled (its client left) or timed out while a shared limiter
    # still decides would otherwise drop an admission granted a moment later, holding the
    # tenant's place until the running TTL. _release_late hands it back instead.
    asked = asyncio.ensure_future(ctx.tenancy.admit(caller.tenant, tokens))
    handed = False  # set only once the admission is the caller's to release
    try:
        admission = await asyncio.wait_for(asyncio.shield(asked), TENANCY_TIMEOUT_S)
        handed = True
        return admission
    except RateLimited as exc:
        raise ApiError(
            429, str(exc), code="rate_limit_exceeded", headers=dict(exc.headers)
        ) from None
    except Exception as exc:  # the shared limiter is unreachable (a timeout, a dead replica)
        log.error("admission of a %s request failed: %s", caller.tenant, exc)
        raise ApiError(
            503, "the rate limiter cannot be reached; try again",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None  # fmt: skip
    finally:
        # Given up on (a timeout, a cancel), even as the limiter answered: release what it
        # grants. A callback added to a done future still runs (on the next loop turn).
        if not handed:
            asked.add_done_callback(lambda done: _release_late(ctx, done))


def _release_late(ctx: ApiContext, asked: asyncio.Future) -> None:
    """Hand back an admission granted after its request stopped waiting for it."""
    if asked.cancelled() or asked.exception() is not None:
        return
    release = asyncio.ensure_future(ctx.tenancy.finish(asked.result(), None, 0))
    release.add_done_callback(_logged)


def _logged(release: asyncio.Future) -> None:
    if not release.cancelled() and release.exception() is not None:
        log.error("a late admission could not be released: %s", release.exception())


async def finish(
    ctx: ApiContext, meter: Meter, out: RequestOutput | None, *, bill: bool = True
) -> None:
    """Record the request's usage (out: its last output; None if it never ran) and release
    its admission, charging the tokens it used (its prompt once among n choices) even when
    it is not metered (a failure, or bill False: a choice of an answer that failed as a
    whole). A store that fails is never the client's error: the tenancy spools the record
    (its store's spool, or a replica's outbox under Ray); one that cannot be spooled is logged."""
    prompt, cached = meter.prompt_of(out) if out is not None else (0, 0)
    used = prompt + out.completion_tokens if out is not None else 0
    try:
        # Built inside the try: a record that cannot be built must not keep the admission.
        record = meter.record(out, prompt, cached) if bill else None
    except Exception as exc:
        log.error("usage of a %s request could not be recorded: %s", meter.caller.tenant, exc)
        record = None
    if record is not None:  # the metrics count what the store records
        ctx.metrics.meter(record.tenant, record.kind, record.prompt_tokens,
                          record.cached_tokens, record.completion_tokens)  # fmt: skip
    if meter.sink is not None:  # a queued item: no admission, metered after its commit
        meter.sink.record = record
        return
    try:
        await asyncio.wait_for(ctx.tenancy.finish(meter.admission, record, used), TENANCY_TIMEOUT_S)
    except Exception as exc:
        log.error("usage of a %s request was not recorded: %s", meter.caller.tenant, exc)
