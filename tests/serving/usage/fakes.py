"""A fake clock for the limiter's tests: time moves only when a test says so, never by sleeping."""

import threading


class FakeClock:
    """Monotonic seconds; each reading first adds `step`, so with step > 0 readings are unique.

    `last` is the reading this thread took most recently: a caller learns the time the limiter
    read under its lock, which orders concurrent callers.
    """

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self.now, self.step = start, step
        self.readings = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            self.readings += 1
            now = self.now
        self._local.last = now
        return now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    @property
    def last(self) -> float:
        return self._local.last
