"""What the HTTP layer needs from the model replicas, and the in-process implementation.

The routes see only the Generator protocol, so the same app runs on an engine in this
process (LocalGenerator: tests, benchmarks, one Ray replica's own engine) or in front of
a pool of remote replicas (serving.deploy wraps its handles in the same protocol).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Protocol

from serving.engine.engine import Engine
from serving.engine.figures import engine_snapshot
from serving.engine.request import GenerateRequest, RequestOutput
from serving.engine.snapshot import EngineSnapshot
from serving.engine.streams import stream_pause


class QueueFull(Exception):
    """The replica's waiting queue is full; the client should retry later (HTTP 429)."""


class Generator(Protocol):
    """Model replicas as the HTTP layer uses them."""

    def generate(
        self, request: GenerateRequest, *, session: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as an async generator; the last one has `finished` set.

        Raises ValueError (from the first iteration) for a request the engine can never
        run and QueueFull when the replica cannot queue it now. Closing the generator
        early aborts the request. `session` keeps a conversation on one replica.
        """
        ...

    async def figures(self) -> list[EngineSnapshot]:
        """One snapshot per replica."""
        ...

    async def ready(self) -> bool:
        """Whether the engine that serves this app's requests (here or forwarded) takes them."""
        ...


class LocalGenerator:
    """One engine in this process, its step loop on a thread started here."""

    def __init__(self, engine: Engine, max_queue: int, *, replica: str = "local",
                 stream_interval: float = 0.0) -> None:  # fmt: skip
        """stream_interval: the longest pause between a stream's increments under load, in
        seconds (stream_pause; server.stream_interval_ms); 0: every output as it comes."""
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.engine, self.max_queue, self.replica = engine, max_queue, replica
        self.stream_interval = stream_interval
        self._num_waiting = 0  # accepted here, no output yet: queued or in prefill
        self._num_streams = 0  # open here, the load stream_pause paces by
        self._lock = threading.Lock()  # callers may run on more than one event loop
        self._running = True
        engine.start()

    async def generate(
        self, request: GenerateRequest, *, session: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """See Generator.generate; `session` is ignored, there is one replica."""
        # Checked here, once, so that a request that can never run is refused (ValueError)
        # before a full queue would refuse it; the engine then does not check it again.
        self.engine.validate(request)
        with self._lock:
            if self._num_waiting >= self.max_queue:
                raise QueueFull(
                    f"{self._num_waiting} requests are waiting, the most this replica queues"
                )
            self._num_waiting += 1
            self._num_streams += 1
        waiting = True
        pace = self._pause if self.stream_interval > 0 else None
        try:
            # aclosing: leaving this generator early must close the engine's stream, whose
            # own cleanup aborts the request; an abandoned stream would run to the end.
            stream = self.engine.add_request(request, validated=True, pace=pace)
            async with aclosing(stream):
                async for out in stream:
                    if waiting:
                        waiting = False
                        self._done_waiting()
                    yield out
        finally:
            with self._lock:
                self._num_streams -= 1
            if waiting:
                self._done_waiting()

    def _pause(self) -> float:
        return stream_pause(self._num_streams, self.stream_interval)

    async def figures(self) -> list[EngineSnapshot]:
        """The engine's figures, as the only replica."""
        return [engine_snapshot(self.engine, self.replica)]

    async def ready(self) -> bool:
        """True from construction until close()."""
        return self._running

    def close(self) -> None:
        """Stop the engine's step loop; requests still running get no more output."""
        self._running = False
        self.engine.shutdown()

    def _done_waiting(self) -> None:
        with self._lock:
            self._num_waiting -= 1
