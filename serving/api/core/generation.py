"""One request through the generator: start it, stream or collect it, record its metrics.

A request is admitted under its tenant's rate limits, then started (its first output
awaited) before any response is sent, so a limit, a full queue, an invalid request or a
failed adapter load still gets a proper status code even when the client asked for a
stream. Leaving early (a client disconnect) closes the generator's stream, which aborts the
request in the engine. When it ends, its usage is recorded (committed before the answer's
last byte) and its admission released (serving.api.core.metering).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from adapters.registry.names import version_label
from adapters.registry.records import Version
from serving.api.core.caller import Principal
from serving.api.core.context import ApiContext
from serving.api.core.errors import ApiError, error_body
from serving.api.core.generator import QueueFull
from serving.api.core.metering import RETRY_AFTER_SECONDS, Meter, PromptBill, admit, finish
from serving.api.core.metrics import BASE
from serving.api.core.queued_call import QueuedCall, queued_call
from serving.engine.request import GenerateRequest, Priority, RequestOutput, TokenLogprob

CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer
log = logging.getLogger("loraserve.api")


@dataclass
class Outcome:
    """A whole generation, collected."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # as RequestOutput's, when asked
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Generation:
    """A started request: iterate it once for its outputs (the first one included)."""

    def __init__(
        self, ctx: ApiContext, stream, first: RequestOutput, meter: Meter, t0: float
    ) -> None:
        self._ctx, self._stream, self._first, self.meter = ctx, stream, first, meter
        self.label = ctx.metrics.label(meter.adapter)
        self._t0, self._ttft = t0, time.perf_counter() - t0
        self._last: RequestOutput = first
        self._closed = False
        self._bill = True  # unbill(): a choice of an answer that failed as a whole
        self._held = False  # hold(): closed by its owner only, once every choice is in

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            out = self._first
            yield out
            while not out.finished:
                try:
                    out = await anext(self._stream)
                except Exception as exc:  # the replica died mid-stream, or its stream broke
                    out = self._lost(exc)
                self._last = out
                yield out
        finally:
            await self.aclose()

    def _lost(self, exc: Exception) -> RequestOutput:
        """The error output that ends a stream whose generator raised after its first output.

        The status line has gone by then: the answer ends with an error event, as a failed
        step's does, rather than being cut; the log gets the cause, the client no traceback.
        """
        cause = (str(exc).splitlines() or [""])[0]
        log.warning(
            "%s failed mid-stream: %s: %s", self._first.request_id, type(exc).__name__, cause
        )
        return RequestOutput(
            self._first.request_id, (), "", finished=True, finish_reason="error",
            prompt_tokens=self._last.prompt_tokens, completion_tokens=self._last.completion_tokens,
            error=REPLICA_FAILED,
        )  # fmt: skip

    async def aclose(self, *, held_too: bool = False) -> None:
        """Close the stream, which aborts the request if it runs on, and record it; once.
        A held generation closes only when its owner says so (held_too)."""
        if self._closed or (self._held and not held_too):
            return
        self._closed = True
        # Shielded: closing is what aborts the request, even while being cancelled; and its
        # usage is recorded however the answer ended.
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()
            self._record()
            await finish(self._ctx, self.meter, self._last, bill=self._bill)

    def hold(self) -> None:
        """Leave the closing (and so the billing) to the owner of several choices, which
        closes them together once it knows whether the answer as a whole succeeded."""
        self._held = True

    def unbill(self) -> None:
        """Record no usage when this closes: its answer failed as a whole, so the client
        got none of it (its tokens still count against the tenant's limits)."""
        self._bill = False

    def _record(self) -> None:
        out = self._last
        reason = (out.finish_reason or "stop") if out.finished else "abort"
        status = {"abort": CLIENT_CLOSED, "error": failed(out).status}.get(reason, 200)
        # A queued item's wait is by design; it would only blur the interactive latencies.
        interactive = self.meter.kind == "interactive"
        ttft = self._ttft if interactive else None
        self._ctx.metrics.observe(
            self.label,
            status=status,
            finish_reason=reason,
            ttft=ttft,
            e2e=time.perf_counter() - self._t0 if interactive else None,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
        )
        name = version_label(self.meter.adapter) if self.meter.adapter else BASE
        self._ctx.metrics.recent.add(self.meter.caller.tenant, name, ttft, out.completion_tokens)
        if self.meter.adapter:
            self._ctx.metrics.count_variants(self.meter.variants)


def new_id(prefix: str) -> str:
    """A fresh id for an answer: prefix, "-" and 32 hex digits."""
    return f"{prefix}-{uuid.uuid4().hex}"


REPLICA_FAILED = "the model replica serving this request failed; retry the request"
SESSION_HEADER = "x-session-affinity"  # keeps a conversation's prefix cache on one replica


def start_terms(request: Request, t0: float, version: Version | None) -> dict:
    """start()'s keyword arguments that the HTTP request and its adapter version give: its
    session (SESSION_HEADER), arrival t0, QueuedCall if a queued item, and LoRA variants."""
    return {
        "session": request.headers.get(SESSION_HEADER),
        "t0": t0,
        "queued": queued_call(request),
        "variants": version.variants if version else (),
    }


async def start(
    ctx: ApiContext,
    request: GenerateRequest,
    *,
    caller: Principal,
    session: str | None,
    t0: float,
    queued: QueuedCall | None = None,
    variants: tuple[str, ...] = (),
    prompt_bill: PromptBill | None = None,
    first_choice: bool = True,
) -> Generation:
    """The request admitted, queued and its first output in hand; 400, 429 or 500 if not.

    A queued item (queued given) runs at batch priority and is not rate limited: the feeder
    paces batches, and its items only use capacity interactive requests leave. `variants`
    are those of the request's adapter (Version.variants), counted in the metrics.
    prompt_bill: shared by the n choices of one prompt, which bill it once (the first choice,
    unless it fails).
    """
    if queued is not None:
        request = dataclasses.replace(request, priority=Priority.BATCH)
        meter = Meter(caller, request.adapter, "batch", sink=queued, variants=variants)
    else:
        admission = await admit(ctx, caller, request)
        meter = Meter(caller, request.adapter, "interactive", admission, variants=variants,
                      prompt_bill=prompt_bill, first_choice=first_choice)  # fmt: skip
    stream = ctx.generator.generate(request, session=session)
    try:
        first = await anext(stream)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
            await finish(ctx, meter, None)
        if isinstance(exc, QueueFull):
            raise ApiError(
                429,
                f"the server is busy ({exc}); retry shortly",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        if isinstance(exc, ValueError):
            raise ApiError(400, str(exc)) from None
        raise
    gen = Generation(ctx, stream, first, meter, t0)
    if first.finish_reason == "error":
        await gen.aclose()
        raise failed(first)
    return gen


def answer(gen: Generation, content: dict) -> JSONResponse:
    """A whole generation's JSON answer, with the tenant's rate-limit headers."""
    return JSONResponse(content, headers=gen.meter.headers)


def cache_salt(ctx: ApiContext, caller: Principal) -> str | None:
    """The prefix-cache salt of caller's requests: its tenant, so that cached_tokens tells no
    tenant what another sent; None on a keyless server, whose one user shares every hit."""
    return caller.tenant if ctx.settings.keys else None


BUSY_RETRY_AFTER_S = 10  # the schema compiler's time limit: by then a thread has freed


def failed(out: RequestOutput) -> ApiError:
    """The error of an output that finished with finish_reason "error": a 400 when the
    request's own data caused it (its sampling fields, its adapter's numbers), a 503 when the
    engine could not serve it now (a retry may succeed), a 429 when the tenant's own earlier
    requests hold its share of what it needs, else a 500."""
    message = f"generation failed: {out.error or 'unknown engine error'}"
    if out.busy:
        status = 429 if out.own_fault else 503
        return ApiError(status, message, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
    return ApiError(400 if out.own_fault else 500, message)


DONE = "[DONE]"  # the data of the last event of an OpenAI or Workers-AI stream


def failed_stream_end(path: str, out: RequestOutput) -> tuple[str, str]:
    """The data of the events that end a stream whose request failed: its error in path's
    style, then [DONE], as a stream that ends well does (and vLLM's failed ones do), so a
    client reads the error and a finished stream, not a cut connection to retry."""
    error = failed(out)
    return json.dumps(error_body(path, error.status, error.message)), DONE


async def drain(gen: Generation) -> Outcome:
    outcome = Outcome()
    text = []
    try:
        async for out in gen:
            if out.finish_reason == "error":
                raise failed(out)
            text.append(out.new_text)
            outcome.token_ids.extend(out.new_token_ids)
            outcome.logprobs.extend(out.logprobs)
            outcome.prompt_logprobs = out.prompt_logprobs or outcome.prompt_logprobs
            if out.finished:
                outcome.finish_reason = out.finish_reason or "stop"
                outcome.prompt_tokens = out.prompt_tokens
                outcome.completion_tokens = out.completion_tokens
                outcome.cached_tokens = out.cached_tokens
    finally:
        # Leaving the loop by a raise leaves gen's iterator suspended; its own close would
        # run only when collected, after the answer: the usage must be committed first.
        await gen.aclose()
    outcome.text = "".join(text)
    return outcome


async def disconnected(request: Request) -> None:
    """Returns when the client has gone; the body has been read by then, so only the
    disconnect message is left to come."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
