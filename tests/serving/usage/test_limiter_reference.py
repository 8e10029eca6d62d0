"""serving.usage.limits against a brute-force reference, sequential and under 16 threads.

The reference keeps every admission in a plain list and, at every decision, recounts the
window and the running requests from scratch: no deques, no running sums, no early exits. A
request runs until it is finished or running_ttl_s has passed since its admission. Each
refusal's wait is the earliest moment at which a recount would admit the request.
"""

import math
import random
import threading
from collections import Counter
from dataclasses import dataclass

import pytest

from serving.usage.limits import Limiter, Limits, RateLimited
from serving.usage.ratelimit_headers import duration
from tests.serving.usage.fakes import FakeClock

WINDOW = 60.0
LONG_TTL, SHORT_TTL = 3600.0, 45.0  # the default; and one inside the window, so that a late
# finish() meets its own reservation still in the window and must leave it charged
LIMITS = [
    Limits(requests_per_minute=8),
    Limits(tokens_per_minute=1000),
    Limits(concurrent_requests=3),
    Limits(requests_per_minute=8, tokens_per_minute=1000, concurrent_requests=3),
    Limits(requests_per_minute=5, tokens_per_minute=600),
]


@dataclass
class Entry:
    time: float
    tokens: int
    running: bool = True


class Reference:
    """The limits recomputed from the whole log of admissions."""

    def __init__(self, limits: Limits, ttl: float) -> None:
        self.limits, self.ttl, self.log = limits, ttl, {}  # ticket -> Entry

    def _in_window(self, at: float) -> list[Entry]:
        return [e for e in self.log.values() if at - WINDOW < e.time <= at]

    def _runs(self, entry: Entry, at: float) -> bool:
        return entry.running and at - self.ttl < entry.time

    def running(self, at: float) -> int:
        """Requests counted as running at `at`: not finished, admitted less than TTL ago."""
        return sum(self._runs(e, at) for e in self.log.values())

    def refusals(self, now: float, tokens: int) -> dict[str, float]:
        """{limit: seconds until it would admit} for each limit refusing `tokens` at `now`."""
        found, window = {}, self._in_window(now)
        later = sorted({e.time + WINDOW for e in window})  # when the window's content changes
        most = self.limits.concurrent_requests
        if most is not None and self.running(now) >= most:
            found["concurrent"] = 1.0
        most = self.limits.requests_per_minute
        if most is not None and len(window) >= most:
            free = [t for t in later if len(self._in_window(t)) < most]
            found["requests"] = free[0] - now
        most = self.limits.tokens_per_minute
        if most is not None and tokens > most:
            found["tokens"] = math.inf  # too large for any window: no wait lets it in
        elif most is not None and sum(e.tokens for e in window) + tokens > most:
            free = [t for t in later if sum(e.tokens for e in self._in_window(t)) + tokens <= most]
            found["tokens"] = free[0] - now
        return found

    def headers(self, now: float) -> dict[str, str]:
        window, expected = self._in_window(now), {}
        if self.limits.requests_per_minute is not None:
            n = self.limits.requests_per_minute
            expected["x-ratelimit-limit-requests"] = str(n)
            expected["x-ratelimit-remaining-requests"] = str(max(0, n - len(window)))
            oldest = min((e.time for e in window), default=now - WINDOW)
            expected["x-ratelimit-reset-requests"] = duration(oldest + WINDOW - now)
        if self.limits.tokens_per_minute is not None:
            m = self.limits.tokens_per_minute
            expected["x-ratelimit-limit-tokens"] = str(m)
            expected["x-ratelimit-remaining-tokens"] = str(
                max(0, m - sum(e.tokens for e in window))
            )
            oldest = min((e.time for e in window), default=now - WINDOW)
            expected["x-ratelimit-reset-tokens"] = duration(oldest + WINDOW - now)
        return expected

    def admit(self, ticket: tuple, now: float, tokens: int) -> None:
        self.log[ticket] = Entry(now, tokens)

    def finish(self, ticket: tuple, now: float, used: int) -> bool:
        """Finish `ticket` at `now`; -> whether it still ran (a second or late one: a no-op)."""
        entry = self.log[ticket]
        if not self._runs(entry, now):
            return False
        entry.running, entry.tokens = False, used
        return True


def _check_admit(reference, now, tokens, outcome) -> None:
    """The limiter's outcome of admit(tokens) at `now` is the reference's, in every detail.

    An admission is then logged in the reference too.
    """
    refusals = reference.refusals(now, tokens)
    if not refusals:
        assert not isinstance(outcome, RateLimited), (now, tokens, outcome.message)
        reference.admit(outcome.ticket, now, tokens)
        assert dict(outcome.headers) == reference.headers(now)  # counted after admitting it
        return
    assert isinstance(outcome, RateLimited), (now, tokens, refusals)
    wait = max(refusals.values())
    assert outcome.retry_after_s == pytest.approx(wait, abs=1e-6)
    assert refusals[outcome.limit] == pytest.approx(wait, abs=1e-6)
    headers = dict(outcome.headers)
    if math.isinf(wait):
        assert "Retry-After" not in headers
    else:
        retry = int(headers.pop("Retry-After"))
        assert retry >= 1 and retry - 1 < max(wait, 1) <= retry + 1e-6  # whole seconds, up
    assert headers == reference.headers(now)


def _attempt(limiter, tenant, tokens):
    try:
        return limiter.admit(tenant, tokens)
    except RateLimited as exc:
        return exc


@pytest.mark.parametrize("ttl", [LONG_TTL, SHORT_TTL])
@pytest.mark.parametrize("limits", LIMITS, ids=repr)
@pytest.mark.parametrize("seed", range(4))
def test_random_traffic_matches_the_reference(limits, seed, ttl):
    rng = random.Random(seed)
    clock = FakeClock()
    limiter, reference = Limiter(lambda tenant: limits, clock, ttl), Reference(limits, ttl)
    running, outcomes, refused_by = [], {"admitted": 0, "refused": 0}, Counter()
    late = 0  # finishes that came after the TTL
    for _ in range(700):
        quiet = rng.random() < 0.03  # now and then a pause around a window's length
        clock.advance(rng.choice([59.75, 60, 61] if quiet else [0, 0, 0.25, 0.5, 1, 2, 3.5, 7]))
        if running and rng.random() < 0.45:
            admission = running.pop(rng.randrange(len(running)))
            used = rng.randrange(0, admission.reserved_tokens + 50)
            limiter.finish(admission, used)
            late += not reference.finish(admission.ticket, clock.now, used)
            if rng.random() < 0.1:  # again: a no-op in both
                limiter.finish(admission, used + 7)
                assert not reference.finish(admission.ticket, clock.now, used + 7)
            continue
        tokens = rng.choice([0, 1, 50, 200, 400, 999, 1000, 1001])
        outcome = _attempt(limiter, "acme", tokens)
        _check_admit(reference, clock.now, tokens, outcome)
        if isinstance(outcome, RateLimited):
            outcomes["refused"] += 1
            refused_by[outcome.limit] += 1
        else:
            outcomes["admitted"] += 1
            running.append(outcome)
        assert limiter.in_flight("acme") == reference.running(clock.now)
    assert min(outcomes.values()) > 50  # the traffic exercised both answers
    assert (late > 0) == (ttl == SHORT_TTL)  # a short TTL was reached, the default never
    names = {"requests_per_minute": "requests", "tokens_per_minute": "tokens"}
    names["concurrent_requests"] = "concurrent"
    assert set(refused_by) == {names[k] for k, v in vars(limits).items() if v is not None}


# A thread often makes its calls back to back, 0.5 s apart: a TTL of a few calls is reached.
@pytest.mark.parametrize("ttl", [LONG_TTL, 2.0])
@pytest.mark.parametrize("limits", LIMITS[3:], ids=repr)
def test_sixteen_threads_match_the_reference_replayed_in_clock_order(limits, ttl):
    # Each clock reading is taken under the limiter's lock and moves time on by 0.5 s, so the
    # readings order every call; replaying the calls in that order must give the same answers.
    clock = FakeClock(step=0.5)
    limiter = Limiter(lambda tenant: limits, clock, ttl)
    events, lock = [], threading.Lock()
    start = threading.Barrier(16)

    def run(seed):
        rng, held = random.Random(seed), []
        start.wait()
        for _ in range(150):
            if held and rng.random() < 0.4:
                admission = held.pop(rng.randrange(len(held)))
                used = rng.randrange(0, admission.reserved_tokens + 1)
                before = clock.last
                limiter.finish(admission, used)
                # A finish reads no clock once the tenant's state is gone: only after every
                # request it held ended or outlived the TTL, so this one is a late no-op.
                at = clock.last if clock.last != before else None
                event = (at, "finish", admission.ticket, used)
            else:
                tokens = rng.choice([0, 10, 100, 300])
                outcome = _attempt(limiter, "acme", tokens)
                if not isinstance(outcome, RateLimited):
                    held.append(outcome)
                event = (clock.last, "admit", tokens, outcome)
            with lock:
                events.append(event)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    timed = [event for event in events if event[0] is not None]
    assert len(events) == 16 * 150
    assert clock.readings == len(timed)  # one reading per call that read one, none shared
    reference, admitted, late = Reference(limits, ttl), 0, len(events) - len(timed)
    for now, kind, value, detail in sorted(timed, key=lambda event: event[0]):
        if kind == "finish":
            late += not reference.finish(value, now, detail)
            continue
        _check_admit(reference, now, value, detail)
        admitted += not isinstance(detail, RateLimited)
    assert admitted > 50 and len(events) - admitted > 50  # both answers, many windows
    assert (late > 0) == (ttl < LONG_TTL)
    in_flight = limiter.in_flight("acme")
    assert in_flight == reference.running(clock.last)  # at the time in_flight() read
