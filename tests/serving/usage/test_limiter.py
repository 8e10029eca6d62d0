"""serving.usage.limits: each limit exact on a fake clock, headers, refusals and their waits."""

import pickle
import re
import threading

import pytest

from serving.usage.limits import Limiter, Limits, RateLimited
from tests.serving.usage.fakes import FakeClock
from tests.serving.usage.fakes import limiter as _limiter
from tests.serving.usage.fakes import refused as _refused

RESET = re.compile(r"^(0s|[1-9]\d{0,2}ms|(\d+m)?\d+(\.\d{1,3})?s)$")


def _hammer(limiter, threads=16, attempts=20, tokens=0):
    """Every thread calls admit() `attempts` times at once; -> (admissions, refusals)."""
    admitted, refused, lock = [], [], threading.Lock()
    start = threading.Barrier(threads)

    def run():
        start.wait()
        for _ in range(attempts):
            try:
                outcome, bucket = limiter.admit("acme", tokens), admitted
            except RateLimited as exc:
                outcome, bucket = exc, refused
            with lock:
                bucket.append(outcome)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return admitted, refused


def test_sixteen_threads_get_exactly_n_admissions_per_window():
    clock = FakeClock()
    limiter = _limiter(clock, requests_per_minute=37)
    admitted, refused = _hammer(limiter)
    assert (len(admitted), len(refused)) == (37, 16 * 20 - 37)
    assert len({a.ticket for a in admitted}) == 37
    assert {e.limit for e in refused} == {"requests"}
    assert {e.retry_after_s for e in refused} == {60.0}  # all admitted at the same instant
    clock.advance(59.999)
    assert _hammer(limiter, threads=4, attempts=1)[0] == []  # still inside the window
    clock.advance(0.001)
    admitted, refused = _hammer(limiter)  # the window slid past every admission
    assert (len(admitted), len(refused)) == (37, 16 * 20 - 37)


def test_the_window_slides_one_admission_at_a_time():
    clock = FakeClock()
    limiter = _limiter(clock, requests_per_minute=3)
    for _ in range(3):
        limiter.admit("acme", 0)
        clock.advance(10)  # admitted at 1000, 1010, 1020
    error = _refused(limiter)  # at 1030
    assert error.retry_after_s == pytest.approx(30)  # 1000 leaves the window at 1060
    assert dict(error.headers)["Retry-After"] == "30"
    clock.advance(29.5)
    assert _refused(limiter).retry_after_s == pytest.approx(0.5)
    assert dict(_refused(limiter).headers)["Retry-After"] == "1"  # rounded up, at least 1
    clock.advance(0.5)
    limiter.admit("acme", 0)  # at 1060
    assert _refused(limiter).retry_after_s == pytest.approx(10)  # 1010 leaves at 1070


def test_tokens_reserved_then_charged_as_used():
    clock = FakeClock()
    limiter = _limiter(clock, tokens_per_minute=1000)
    first = limiter.admit("acme", 600)  # reserves prompt + max_tokens
    clock.advance(5)
    error = _refused(limiter, 500)
    assert error.limit == "tokens"
    assert error.retry_after_s == pytest.approx(55)  # the 600 leave the window at +60
    assert "600 used or reserved" in error.message
    limiter.finish(first, 350)  # it used fewer: the difference returns to the window at once
    second = limiter.admit("acme", 500)
    assert dict(second.headers)["x-ratelimit-remaining-tokens"] == "150"
    limiter.finish(first, 0)  # finished already: no change
    assert _refused(limiter, 151).retry_after_s == pytest.approx(55)
    clock.advance(55)  # the first charge (350, still dated +0) leaves the window
    assert dict(limiter.admit("acme", 500).headers)["x-ratelimit-remaining-tokens"] == "0"
    limiter.finish(second, 900)  # used more than reserved (a caller's miscount): charged all
    assert _refused(limiter, 1).retry_after_s == pytest.approx(5)


def test_a_request_larger_than_the_token_limit_is_refused_outright():
    limiter = _limiter(tokens_per_minute=1000)
    error = _refused(limiter, 1001)
    assert error.limit == "tokens"
    assert "larger than the tokens-per-minute limit" in error.message
    assert "1001" in error.message and "1000" in error.message
    # No Retry-After: clients that retry 429s would retry a request no wait lets in.
    assert error.retry_after_s == float("inf") and "Retry-After" not in dict(error.headers)
    assert "x-ratelimit-limit-tokens" in dict(error.headers)
    assert limiter.admit("acme", 1000).reserved_tokens == 1000  # exactly the limit fits


def test_a_finish_after_the_window_changes_no_later_window():
    clock = FakeClock()
    limiter = _limiter(clock, tokens_per_minute=100)
    old = limiter.admit("acme", 100)
    clock.advance(60)
    fresh = limiter.admit("acme", 100)  # the old charge left the window
    limiter.finish(old, 0)  # must not hand its 100 back to the window it is not in
    assert _refused(limiter, 1).limit == "tokens"
    limiter.finish(fresh, 40)
    assert dict(limiter.admit("acme", 60).headers)["x-ratelimit-remaining-tokens"] == "0"


def test_concurrent_requests_are_released_by_finish_once():
    limiter = _limiter(concurrent_requests=2)
    a, b = limiter.admit("acme", 5), limiter.admit("acme", 5)
    assert limiter.in_flight("acme") == 2
    error = _refused(limiter)
    assert (error.limit, error.retry_after_s) == ("concurrent", 1.0)
    assert dict(error.headers) == {"Retry-After": "1"}  # OpenAI has no concurrency headers
    limiter.finish(a, 5)
    limiter.finish(a, 5)  # idempotent: frees one place, not two
    assert limiter.in_flight("acme") == 1
    c = limiter.admit("acme", 5)
    _refused(limiter)
    for admission in (b, c):
        limiter.finish(admission, 0)
    assert limiter.in_flight("acme") == 0


def test_concurrency_under_threads_never_exceeds_the_limit():
    limiter = _limiter(concurrent_requests=5)
    admitted, refused = _hammer(limiter)
    assert len(admitted) == 5 and limiter.in_flight("acme") == 5
    assert {e.limit for e in refused} == {"concurrent"}


def test_the_longest_wait_wins_when_several_limits_refuse():
    clock = FakeClock()
    limiter = _limiter(clock, requests_per_minute=1, concurrent_requests=1)
    limiter.admit("acme", 0)
    clock.advance(20)
    error = _refused(limiter)
    assert (error.limit, error.retry_after_s) == ("requests", pytest.approx(40))


def test_a_tenant_without_limits_costs_nothing():
    def no_clock():
        raise AssertionError("the clock is not read for a tenant without limits")

    limiter = Limiter(lambda tenant: Limits(), no_clock)
    first, second = limiter.admit("free", 10**9), limiter.admit("free", 0)
    assert first.headers == () and second.ticket != first.ticket
    limiter.finish(first, 10)
    limiter.finish(first, 10)
    assert limiter.in_flight("free") == 0
    assert limiter._tenants == {}  # no state kept


def test_tenants_are_limited_apart():
    limiter = _limiter(requests_per_minute=1)
    limiter.admit("acme", 0)
    _refused(limiter)
    for _ in range(50):
        limiter.admit("other", 0)  # no limits configured for it


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "5"])
def test_limits_must_be_positive_integers(value):
    with pytest.raises(
        ValueError,
        match=re.escape(f"tokens_per_minute must be None or a positive integer, got {value!r}"),
    ):
        Limits(tokens_per_minute=value)


def test_token_counts_must_be_integers_at_least_zero():
    limiter = _limiter(tokens_per_minute=10)
    with pytest.raises(ValueError, match="tokens must be an integer >= 0, got -1"):
        limiter.admit("acme", -1)
    admission = limiter.admit("acme", 1)
    with pytest.raises(ValueError, match=r"tokens_used must be an integer >= 0, got 2\.0"):
        limiter.finish(admission, 2.0)


def test_changed_limits_apply_to_the_next_request():
    clock, current = FakeClock(), {"limits": Limits(requests_per_minute=5)}
    limiter = Limiter(lambda tenant: current["limits"], clock)
    for _ in range(5):
        limiter.admit("acme", 0)
        clock.advance(1)  # admitted at +0 .. +4
    current["limits"] = Limits(requests_per_minute=2)  # lowered (a config reload)
    clock.advance(5)
    error = _refused(limiter)  # at +10, four must leave: the fourth leaves at +63
    assert error.retry_after_s == pytest.approx(53)
    assert dict(error.headers)["x-ratelimit-remaining-requests"] == "0"
    current["limits"] = Limits(requests_per_minute=6)  # raised: one more fits
    limiter.admit("acme", 0)
    assert _refused(limiter).retry_after_s == pytest.approx(50)


def test_a_lost_finish_frees_its_place_after_the_ttl_and_not_before():
    clock = FakeClock()
    limiter = _limiter(clock, running_ttl_s=100, concurrent_requests=1)
    leaked = limiter.admit("acme", 0)  # at 1000; its caller never finishes it
    clock.advance(99.5)
    assert _refused(limiter).limit == "concurrent"
    assert limiter.in_flight("acme") == 1
    clock.advance(0.5)  # 1100: admitted exactly running_ttl_s ago
    assert limiter.in_flight("acme") == 0
    fresh = limiter.admit("acme", 0)
    limiter.finish(leaked, 0)  # late: frees nothing, above all not the fresh request's place
    assert limiter.in_flight("acme") == 1
    assert _refused(limiter).limit == "concurrent"
    limiter.finish(fresh, 0)
    assert limiter.in_flight("acme") == 0


def test_a_finish_past_the_ttl_leaves_the_reservation_charged():
    clock = FakeClock()
    limiter = _limiter(clock, running_ttl_s=30, tokens_per_minute=100, concurrent_requests=1)
    leaked = limiter.admit("acme", 100)  # at 1000
    clock.advance(30)
    limiter.finish(leaked, 0)  # past the TTL: the 100 reserved stay in the window
    error = _refused(limiter, 1)
    assert (error.limit, error.retry_after_s) == ("tokens", pytest.approx(30))
    clock.advance(30)  # the charge leaves the window at 1060
    assert dict(limiter.admit("acme", 100).headers)["x-ratelimit-remaining-tokens"] == "0"


def test_expired_tickets_leave_no_state_behind():
    clock = FakeClock()
    limiter = _limiter(clock, running_ttl_s=90, concurrent_requests=2)
    limiter.admit("acme", 0)
    clock.advance(45)
    limiter.admit("acme", 0)
    clock.advance(45)  # 1090: the first is past the TTL, the second is not
    assert limiter.in_flight("acme") == 1
    clock.advance(45)
    assert limiter.in_flight("acme") == 0
    assert limiter._tenants == {}  # nothing runs and no limit keeps a window


def test_a_finish_from_another_limiter_frees_nothing():
    # A restarted limiter is a new instance; an Admission from the old one may still arrive.
    before, after = _limiter(concurrent_requests=1), _limiter(concurrent_requests=1)
    old, live = before.admit("acme", 0), after.admit("acme", 0)  # each its first ticket
    assert old.ticket != live.ticket
    after.finish(pickle.loads(pickle.dumps(old)), 0)  # as it crosses Ray
    assert after.in_flight("acme") == 1
    assert _refused(after).limit == "concurrent"
    after.finish(live, 0)
    assert after.in_flight("acme") == 0


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan")])
def test_the_running_ttl_must_be_positive(ttl):
    with pytest.raises(ValueError, match="running_ttl_s must be > 0 seconds"):
        Limiter(lambda tenant: Limits(), FakeClock(), ttl)
