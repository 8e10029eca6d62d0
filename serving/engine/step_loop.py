"""The engine's step thread: step() until stopped, waiting briefly when there is nothing to do."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class StepLoop:
    """Runs step() -> busy on a daemon thread; on_fault(exc) when a whole step raises."""

    def __init__(self, step: Callable[[], bool], on_fault: Callable[[Exception], None]):
        self._step, self._on_fault = step, on_fault
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        """Cut an idle wait short: there is new work."""
        self._wake.set()

    def pause(self, timeout: float) -> None:
        """Wait until woken (or timeout); a wake that came since the last pause ends it at once."""
        self._wake.wait(timeout=timeout)
        self._wake.clear()

    @property
    def alive(self) -> bool:
        """False once started and the thread has ended (stopped, or killed by a bug here)."""
        return self._thread is None or self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self._step()
            except Exception as exc:  # a fault must not end the loop that serves everyone
                logger.exception("engine step failed")
                self._on_fault(exc)
                busy = True
            if not busy:
                self.pause(0.05)
