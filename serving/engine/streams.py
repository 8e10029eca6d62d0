"""An engine request as an asyncio stream: the step thread's callbacks, handed to the caller's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from serving.engine.request import GenerateRequest, RequestOutput


async def stream_outputs(engine, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
    """Submit request to engine; yield its outputs; leaving early aborts it."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

    def sink(out: RequestOutput) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, out)
        except RuntimeError:  # the caller's loop has closed: nobody reads this stream
            engine.abort(request.request_id)

    engine.submit(request, sink)
    finished = False
    try:
        while not finished:
            out = await queue.get()
            finished = out.finished
            yield out
    finally:
        if not finished:
            engine.abort(request.request_id)
