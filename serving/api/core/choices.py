"""The generations of one answer, started, collected or streamed together: a choice per
prompt and per n on the OpenAI routes, and the one generation of any other answer.

Each is a request of its own (admitted, metered and aborted on its own), started together
so that they share engine steps. The answer is whole or an error: one that cannot start,
or fails, ends them all, unbilled; a client that leaves aborts them all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence

import anyio
from fastapi import Request

from serving.api.core.errors import ApiError
from serving.api.core.generation import CLIENT_CLOSED, Generation, Outcome, disconnected, drain
from serving.engine.request import RequestOutput


async def start_all(starts: Sequence[Awaitable[Generation]]) -> list[Generation]:
    """Every generation started, in order; if any cannot start, the others are closed and
    the first failure (in order) is raised. Cancelled meanwhile (the client left), those
    already started are closed too: none is left running unmetered."""
    tasks = [asyncio.ensure_future(s) for s in starts]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            await close_all([r for r in ended if isinstance(r, Generation)])
        raise
    failure = next((t.exception() for t in tasks if t.exception() is not None), None)
    started = [t.result() for t in tasks if t.exception() is None]
    if failure is not None:
        for gen in started:  # the client gets the failure, none of these: not billed
            gen.unbill()
        await close_all(started)
        raise failure
    return started


async def close_all(gens: Sequence[Generation]) -> None:
    for gen in gens:
        await gen.aclose(held_too=True)


async def collect_all(gens: Sequence[Generation], request: Request) -> list[Outcome]:
    """Every generation's outputs joined, in order; a failure in one (its error, the first
    in order) or a client that disconnects meanwhile ends them all."""
    for gen in gens:  # billed together below, or not at all when one fails
        gen.hold()
    drains = [asyncio.ensure_future(drain(g)) for g in gens]
    gone = asyncio.ensure_future(disconnected(request))
    try:
        waiting = {*drains, gone}
        while not gone.done() and not all(t.done() for t in drains):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() is not None for t in done if t is not gone):
                for gen in gens:  # the answer is the failure: no choice of it is billed
                    gen.unbill()
                break
    finally:
        await _ended([*drains, gone], gens)
    failure = next((t.exception() for t in drains if not t.cancelled() and t.exception()), None)
    if failure is not None:
        raise failure
    if any(t.cancelled() for t in drains):
        raise ApiError(CLIENT_CLOSED, "the client disconnected")
    return [t.result() for t in drains]


async def merged(gens: Sequence[Generation]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, output) of every generation as each comes; ends when all have
    finished, or with the first error output (the others are then closed)."""
    queue: asyncio.Queue[tuple[int, RequestOutput | None]] = asyncio.Queue()

    async def pump(k: int, gen: Generation) -> None:
        try:
            async for out in gen:
                await queue.put((k, out))
        finally:
            await queue.put((k, None))

    tasks = [asyncio.ensure_future(pump(k, g)) for k, g in enumerate(gens)]
    try:
        running = len(tasks)
        while running:
            k, out = await queue.get()
            if out is None:
                running -= 1
                continue
            yield k, out
            if out.finish_reason == "error":
                return
    finally:
        await _ended(tasks, gens)


async def _ended(tasks: Sequence[asyncio.Future], gens: Sequence[Generation]) -> None:
    """Cancel tasks, wait until they have stopped, then close gens: a generation is never
    closed while a task still reads it. Shielded, so a cancelled caller still meters all."""
    with anyio.CancelScope(shield=True):
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await close_all(gens)
