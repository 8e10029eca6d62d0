"""An admission the shared limiter grants after its request stopped waiting (its client
left, or the wait timed out) is handed back, not held until the running TTL: a tenant at its
concurrent_requests limit would otherwise lose a place per such request."""

import asyncio
from types import SimpleNamespace

import pytest

from serving.api.core import metering
from serving.api.core.caller import Principal
from serving.api.core.errors import ApiError
from serving.engine.request import GenerateRequest, SamplingParams
from serving.usage.limits import Admission


class SlowLimiter:
    """Grants every admission after `delay` seconds; notes what is handed back."""

    def __init__(self, delay: float):
        self.delay, self.granted, self.released = delay, [], []

    async def admit(self, tenant, tokens):
        await asyncio.sleep(self.delay)
        admission = Admission(len(self.granted), tenant, tokens)
        self.granted.append(admission)
        return admission

    async def finish(self, admission, record, tokens_used):
        self.released.append((admission, record, tokens_used))


def context(limiter):
    settings = SimpleNamespace(
        limits_of=lambda tenant: {"concurrent_requests": 2}, max_model_len=64
    )
    return SimpleNamespace(settings=settings, tenancy=limiter)


CALLER = Principal("acme", "user", "k1")
REQUEST = GenerateRequest("r1", (1, 2, 3), SamplingParams(max_tokens=4))


def test_an_admission_granted_after_its_caller_left_is_released():
    limiter = SlowLimiter(0.1)

    async def scenario():
        waiting = asyncio.ensure_future(metering.admit(context(limiter), CALLER, REQUEST))
        await asyncio.sleep(0.02)
        waiting.cancel()  # the client left while the limiter decided
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0.2)  # the grant arrives, and is handed back at once

    asyncio.run(scenario())
    assert [a for a, _, _ in limiter.released] == limiter.granted and len(limiter.granted) == 1
    assert limiter.released[0][1:] == (None, 0)  # nothing recorded or charged


def test_an_admission_granted_after_the_wait_timed_out_is_released(monkeypatch):
    monkeypatch.setattr(metering, "TENANCY_TIMEOUT_S", 0.05)
    limiter = SlowLimiter(0.15)

    async def scenario():
        with pytest.raises(ApiError) as caught:
            await metering.admit(context(limiter), CALLER, REQUEST)
        assert caught.value.status == 503
        await asyncio.sleep(0.25)

    asyncio.run(scenario())
    assert len(limiter.granted) == 1 and limiter.released[0][0] == limiter.granted[0]


def test_an_admission_in_time_is_the_callers_to_release():
    limiter = SlowLimiter(0.0)
    admission = asyncio.run(metering.admit(context(limiter), CALLER, REQUEST))
    assert admission == limiter.granted[0] and limiter.released == []


@pytest.mark.parametrize("delay_s", [0.0095, 0.01, 0.0102, 0.0105])
def test_an_admission_granted_as_the_wait_times_out_is_released(monkeypatch, delay_s):
    """The limiter answers within a loop turn of the deadline: the caller got its 503, so
    the admission is handed back, never left held (nor released twice)."""
    monkeypatch.setattr(metering, "TENANCY_TIMEOUT_S", 0.01)

    async def scenario():
        limiter = SlowLimiter(delay_s)
        outcomes = []
        for _ in range(20):
            try:
                outcomes.append(await metering.admit(context(limiter), CALLER, REQUEST))
            except ApiError as exc:
                assert exc.status == 503
        await asyncio.sleep(0.05)
        return limiter, outcomes

    limiter, outcomes = asyncio.run(scenario())
    released = [a for a, _, _ in limiter.released]
    # every grant is either the caller's (returned) or handed back, exactly once
    assert sorted(released + outcomes, key=lambda a: a.ticket) == limiter.granted
