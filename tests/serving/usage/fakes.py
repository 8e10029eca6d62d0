"""A fake clock for the limiter's tests (time moves only when a test says so, never by sleeping),
and a limiter on it."""

import threading

import pytest

from serving.usage.limits import Limiter, Limits, RateLimited


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


def limiter(clock=None, running_ttl_s=3600.0, **limits) -> Limiter:
    """A limiter on a fake clock with `limits` for tenant acme and none for any other."""
    fixed = Limits(**limits)

    def limits_of(tenant: str) -> Limits:
        return fixed if tenant == "acme" else Limits()

    return Limiter(limits_of, clock or FakeClock(), running_ttl_s)


def refused(limiter, tokens=0, tenant="acme") -> RateLimited:
    """The refusal limiter gives an admission of `tokens` for tenant."""
    with pytest.raises(RateLimited) as info:
        limiter.admit(tenant, tokens)
    return info.value
