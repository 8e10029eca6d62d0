"""serving.usage.limits with serving.usage.ratelimit_headers: the headers of admissions and
refusals, OpenAI's duration format, and a refusal that crosses processes intact."""

import pickle
import re

import pytest

from serving.usage.limits import RateLimited
from serving.usage.ratelimit_headers import duration
from tests.serving.usage.fakes import FakeClock
from tests.serving.usage.fakes import limiter as _limiter
from tests.serving.usage.fakes import refused as _refused

RESET = re.compile(r"^(0s|[1-9]\d{0,2}ms|(\d+m)?\d+(\.\d{1,3})?s)$")


def test_headers_are_openais_and_well_formed():
    clock = FakeClock()
    limiter = _limiter(clock, requests_per_minute=10, tokens_per_minute=5000)
    limiter.admit("acme", 1000)
    clock.advance(15.75)
    admission = limiter.admit("acme", 200)
    assert admission.headers == (
        ("x-ratelimit-limit-requests", "10"),
        ("x-ratelimit-limit-tokens", "5000"),
        ("x-ratelimit-remaining-requests", "8"),
        ("x-ratelimit-remaining-tokens", "3800"),
        ("x-ratelimit-reset-requests", "44.25s"),  # the first admission leaves the window
        ("x-ratelimit-reset-tokens", "44.25s"),
    )
    for name, value in admission.headers:
        assert name == name.lower() and name.startswith("x-ratelimit-")
        assert value.isdigit() if "reset" not in name else RESET.match(value), (name, value)
    only_tokens = _limiter(tokens_per_minute=7).admit("acme", 3)
    assert [name for name, _ in only_tokens.headers] == [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ]


def test_refusal_headers_carry_retry_after_and_the_state():
    limiter = _limiter(requests_per_minute=2)
    limiter.admit("acme", 0)
    limiter.admit("acme", 0)
    headers = dict(_refused(limiter).headers)
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    assert headers["Retry-After"] == "60"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (0.0004, "1ms"),
        (0.25, "250ms"),
        (0.999, "999ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (44.25, "44.25s"),
        (59.9991, "1m0s"),
        (60, "1m0s"),
        (61.125, "1m1.125s"),
        (360, "6m0s"),
    ],
)
def test_durations_are_written_as_openai_does(seconds, text):
    assert duration(seconds) == text
    assert RESET.match(text)


def test_rate_limited_crosses_processes_intact():
    error = RateLimited("tokens", "too many", 12.5, (("Retry-After", "13"),))
    again = pickle.loads(pickle.dumps(error))
    assert (again.limit, again.message, again.retry_after_s, again.headers) == (
        "tokens",
        "too many",
        12.5,
        (("Retry-After", "13"),),
    )
    assert str(again) == "too many"
    admission = _limiter(tokens_per_minute=9).admit("acme", 3)
    again = pickle.loads(pickle.dumps(admission))
    assert again == admission and hash(again.ticket) == hash(admission.ticket)
    assert again.headers == (
        ("x-ratelimit-limit-tokens", "9"),
        ("x-ratelimit-remaining-tokens", "6"),
        ("x-ratelimit-reset-tokens", "1m0s"),
    )
