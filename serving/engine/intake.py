"""Requests and aborts handed to the engine from any thread, taken by its step loop at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from serving.engine.request import GenerateRequest
from serving.engine.tracked import Sink


class Intake:
    """The only state callers share with the step thread, behind one lock."""

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._lock = threading.Lock()
        self._requests: list[tuple[GenerateRequest, Sink]] = []
        self._aborts: list[str] = []

    def put(self, request: GenerateRequest, sink: Sink) -> None:
        with self._lock:
            self._requests.append((request, sink))
        self._wake()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake()

    def take(self) -> tuple[list[tuple[GenerateRequest, Sink]], list[str]]:
        """Everything put and aborted since the last take, in order."""
        with self._lock:
            taken = self._requests, self._aborts
            self._requests, self._aborts = [], []
        return taken
