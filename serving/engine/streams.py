"""An engine request as an asyncio stream: the step thread's callbacks, handed to the caller's loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from serving.engine.request import GenerateRequest, RequestOutput


async def stream_outputs(
    engine, request: GenerateRequest, *, validated: bool = False
) -> AsyncIterator[RequestOutput]:
    """Submit request to engine (validated: engine.validate ran on it); yield its outputs;
    leaving early aborts it."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

    def sink(out: RequestOutput) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, out)
        except RuntimeError:  # the caller's loop has closed: nobody reads this stream
            engine.abort(request.request_id)

    engine.submit(request, sink, validated=validated)
    finished = False
    try:
        while not finished:
            out = await queue.get()
            # A consumer slower than the engine (a network hop, a busy client) gets what has
            # piled up as one increment: fewer, larger messages, the same tokens and text.
            while not out.finished and not queue.empty():
                out = merge_outputs(out, queue.get_nowait())
            finished = out.finished
            yield out
    finally:
        if not finished:
            engine.abort(request.request_id)


def merge_outputs(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One increment saying what first and then say in turn (then's totals and finish)."""
    return dataclasses.replace(
        then,
        new_token_ids=first.new_token_ids + then.new_token_ids,
        new_text=first.new_text + then.new_text,
        logprobs=first.logprobs + then.logprobs,
    )
