"""Server-sent event answers of a generation, which end when their client stops reading.

A client that stops reading without disconnecting would otherwise hold its engine slot (KV
blocks, a sequence, an adapter pin) for as long as it likes: once the socket's buffers are
full, every write waits. Each write here may wait send_timeout seconds; then the stream is
closed, which aborts the request in the engine, and the connection is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from serving.api.core.choices import close_all
from serving.api.core.generation import Generation

log = logging.getLogger("loraserve.api")
PING_SECONDS = 15


def event_stream(
    gens: Generation | Sequence[Generation], events: AsyncGenerator[str, None],
    send_timeout: float,
) -> EventSourceResponse:  # fmt: skip
    """An SSE answer of events (the data of each event) that closes gens however it ends."""
    gens = (gens,) if isinstance(gens, Generation) else tuple(gens)

    async def closing() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        finally:
            # When a write times out, events is closed where it stands, at a yield, which
            # does not reach the iteration of gens inside it: close them all here. Shielded:
            # a cancelled stream (its client left) must still end and meter every request,
            # and events first, so that no task still reads a generation being closed.
            with anyio.CancelScope(shield=True):
                await events.aclose()
                await close_all(gens)

    return _Stream(
        gens,
        closing(),
        sep="\n",
        ping=PING_SECONDS,
        send_timeout=send_timeout,
        headers=gens[-1].meter.headers,
    )


class _Stream(EventSourceResponse):
    def __init__(self, gens: Sequence[Generation], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gens = gens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            # The request is aborted by now; the server drops the half-sent answer.
            log.info("closed the stream of %s: its client stopped reading", scope.get("path"))
        finally:
            # An answer that never started its body (its start failed, or it was cancelled
            # first) never ran closing(): the requests must still end and release their place.
            await close_all(self.gens)
