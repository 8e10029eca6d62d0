"""An engine request as an asyncio stream: the step thread's callbacks, handed to the caller's loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import weakref
from collections.abc import AsyncIterator, Callable

from serving.engine.request import GenerateRequest, RequestOutput

MESSAGES_PER_SECOND = 640  # stream increments a replica sends, all its streams together


def stream_pause(active_streams: int, longest: float) -> float:
    """Seconds a stream waits between increments: active_streams / MESSAGES_PER_SECOND, at
    most longest (one stream: ~2 ms; 64: 100 ms).

    Each increment costs the server's event loop and HTTP stack (and, forwarded between
    replicas, a Ray message) about as much as a step of the engine costs a row, and they
    compete for the same cores and interpreter: pacing keeps their total rate flat however
    many streams are open, so more of the cores go to the engine. Idle, a stream is not held
    back; the first token is never paced, nor the last.
    """
    return min(longest, active_streams / MESSAGES_PER_SECOND)


async def stream_outputs(
    engine,
    request: GenerateRequest,
    *,
    validated: bool = False,
    pace: Callable[[], float] | None = None,
) -> AsyncIterator[RequestOutput]:
    """Submit request to engine (validated: engine.validate ran on it); yield its outputs;
    leaving early aborts it. pace: seconds to wait after each increment (stream_pause), the
    engine's outputs meanwhile merged into the next one; the request's end cuts it short."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
    ended = asyncio.Event()  # the last output is in the queue

    def put(out: RequestOutput) -> None:
        queue.put_nowait(out)
        if out.finished:
            ended.set()

    mailbox = _mailbox(loop)

    def sink(out: RequestOutput) -> None:
        try:
            mailbox.post(put, out)
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
            pause = pace() if pace is not None and not finished else 0.0
            if pause > 0 and not ended.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ended.wait(), pause)
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
        prompt_logprobs=first.prompt_logprobs or then.prompt_logprobs,  # on one of them only
    )


class _Mailbox:
    """The step thread's outputs for the streams of one event loop, handed over in one wake-up
    of the loop however many a step makes.

    A wake-up (call_soon_threadsafe) writes to the loop's socket, and that system call lets
    go of the interpreter: one per output made the step thread wait for the interpreter
    again, behind the loop's work, up to once per row of every step.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # a strong one would keep the loop's entry for ever
        self._lock = threading.Lock()
        self._posted: list[tuple[Callable[[RequestOutput], None], RequestOutput]] = []
        self._scheduled = False  # a drain is on the loop's way; posts just join it

    def post(self, put: Callable[[RequestOutput], None], out: RequestOutput) -> None:
        """put(out) on the loop, soon; RuntimeError where the loop has closed."""
        loop = self._loop()
        if loop is None or loop.is_closed():  # a drain it was sent may never have run
            raise RuntimeError("the stream's event loop has closed")
        with self._lock:
            self._posted.append((put, out))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
                self._posted.clear()  # for a closed loop: nobody will read them
            raise

    def _drain(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            self._scheduled = False
        for put, out in posted:
            put(out)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)
_mailboxes_lock = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    """The loop's mailbox, made on its first stream; gone with the loop."""
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _Mailbox(loop)
        return box
