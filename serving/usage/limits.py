"""Per-tenant rate limits, exact over a sliding 60 s window (a log of admissions, not a bucket).

Semantics, per tenant; a limit of None is no limit:
  requests_per_minute N   a request arriving at t is admitted only if fewer than N were
                          admitted in (t - 60, t]; so no 60 s window ever holds more than N.
  tokens_per_minute M     admit(tenant, tokens) reserves `tokens` (the caller passes prompt
                          tokens + max_tokens) at the admission time t, and is admitted only if
                          the charges of the admissions in (t - 60, t] plus the reservation stay
                          <= M. finish() replaces the reservation by the tokens used, still
                          dated t. A reservation above M alone is refused outright.
  concurrent_requests C   at most C requests admitted and not yet finished, nor older than
                          running_ttl_s (default 1 h) since their admission.

A request still running running_ttl_s after its admission stops counting: a finish() that never
comes (its caller died, or its call timed out after the limiter admitted) must not hold a
tenant's place forever. So no request should run longer than the TTL: past it, its place is
given away and its late finish() changes nothing (its reservation stays charged as reserved).
Tickets carry a random epoch drawn by each Limiter, so an Admission made before the limiter
restarted (a new instance) never finishes a request of the new one.

A refusal raises RateLimited carrying the soonest moment the refusing limit could admit the
request (the longest such wait when several refuse). Answers carry OpenAI's x-ratelimit-*
headers for the limits that are set; a reset is the time until the window frees its next
unit (serving.usage.ratelimit_headers). One lock guards every tenant's state and the clock is read under it, once per call, so
concurrent callers are ordered exactly as their admission times. A tenant with no limit
skips all of it: no lock, no state, empty headers. A tenant's state is bounded by its
limits, and dropped once no request runs (finished or past the TTL) and its window is empty.
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from serving.usage.ratelimit_headers import Headers, ratelimit_headers
from serving.usage.tenant_window import WINDOW_S, Charge, TenantWindow, Ticket, tokens_free_at

CONCURRENT_RETRY_S = 1.0  # when a running request ends cannot be foreseen: ask again soon
RUNNING_TTL_S = 3600.0  # longer than any request should run, short enough to heal a leak


@dataclass(frozen=True)
class Limits:
    """One tenant's rate limits; None = unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{field.name} must be None or a positive integer, got {value!r}")

    @property
    def unlimited(self) -> bool:
        """Whether no limit is set, so admission costs nothing."""
        return all(getattr(self, field.name) is None for field in fields(self))


RATE_LIMITS = tuple(field.name for field in fields(Limits))


@dataclass(frozen=True)
class Admission:
    """An admitted request: hand it back to finish() when the request ends."""

    ticket: Ticket
    tenant: str
    reserved_tokens: int
    headers: Headers = ()  # OpenAI's x-ratelimit-* headers for the answer


class RateLimited(Exception):
    """A request refused by a limit ("requests", "tokens" or "concurrent"), with when to retry."""

    def __init__(self, limit: str, message: str, retry_after_s: float, headers: Headers = ()):
        super().__init__(message)
        self.limit, self.message, self.retry_after_s = limit, message, retry_after_s
        self.headers = headers  # x-ratelimit-* and Retry-After

    def __reduce__(self):
        # Pickled whole, so the refusal crosses a process (a shared limiter) intact.
        return type(self), (self.limit, self.message, self.retry_after_s, self.headers)


class Limiter:
    """Admits or refuses requests under each tenant's Limits; thread-safe."""

    def __init__(
        self,
        limits_of: Callable[[str], Limits],
        clock: Callable[[], float] = time.monotonic,
        running_ttl_s: float = RUNNING_TTL_S,
    ) -> None:
        if not running_ttl_s > 0:
            raise ValueError(f"running_ttl_s must be > 0 seconds, got {running_ttl_s!r}")
        self.limits_of, self.clock, self.running_ttl_s = limits_of, clock, running_ttl_s
        self._lock = threading.Lock()
        self._tenants: dict[str, TenantWindow] = {}
        self._epoch = secrets.randbits(64)  # another instance's tickets never match ours
        self._counts = itertools.count(1)  # next() on a count is atomic: no lock needed

    def _ticket(self) -> Ticket:
        return (self._epoch, next(self._counts))

    def admit(self, tenant: str, tokens: int) -> Admission:
        """Admit a request reserving `tokens`, or raise RateLimited."""
        if type(tokens) is not int or tokens < 0:
            raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
        limits = self.limits_of(tenant)
        if limits.unlimited:
            return Admission(self._ticket(), tenant, tokens)
        with self._lock:
            now = self.clock()
            state = self._tenants.get(tenant) or self._tenants.setdefault(tenant, TenantWindow())
            state.expire(now, self.running_ttl_s)
            refusals = _refusals(limits, state, tokens, now)
            if refusals:
                limit, message, wait = max(refusals, key=lambda refusal: refusal[2])
                headers = ratelimit_headers(limits, state, now)
                if math.isfinite(wait):  # none for a request no wait lets in
                    headers = (*headers, ("Retry-After", str(max(1, math.ceil(wait - 1e-9)))))
                raise RateLimited(limit, message, wait, headers)
            ticket, charge = self._ticket(), None
            if limits.requests_per_minute is not None:
                state.admitted.append(now)
            if limits.tokens_per_minute is not None:
                charge = Charge(now, tokens)
                state.charges.append(charge)
                state.charged += tokens
            state.running[ticket] = (now, charge)
            return Admission(ticket, tenant, tokens, ratelimit_headers(limits, state, now))

    def finish(self, admission: Admission, tokens_used: int) -> None:
        """End an admitted request: free its place, charge `tokens_used`.

        A no-op for an admission finished already, past the running TTL, or made by another
        Limiter instance.
        """
        if type(tokens_used) is not int or tokens_used < 0:
            raise ValueError(f"tokens_used must be an integer >= 0, got {tokens_used!r}")
        with self._lock:
            state = self._tenants.get(admission.tenant)
            if state is None:
                return  # admitted without limits, or nothing of this tenant is left
            now = self.clock()
            state.expire(now, self.running_ttl_s)
            if admission.ticket in state.running:
                _, charge = state.running.pop(admission.ticket)
                # After expire() a charge inside the window is still counted in `charged`.
                if charge is not None and charge.time > now - WINDOW_S:
                    state.charged += tokens_used - charge.tokens
                    charge.tokens = tokens_used
            if state.idle():
                del self._tenants[admission.tenant]

    def in_flight(self, tenant: str) -> int:
        """Requests admitted under limits, not finished nor past the TTL (no limits: 0)."""
        with self._lock:
            state = self._tenants.get(tenant)
            if state is None:
                return 0
            state.expire(self.clock(), self.running_ttl_s)
            if state.idle():
                del self._tenants[tenant]
            return len(state.running)

    def window(self, tenant: str) -> dict[str, int | None]:
        """What tenant's limits count now: "requests" admitted and "tokens" charged in the
        window (t - 60, t], each None when its limit is not set (nothing is kept for it), and
        "running" as in_flight(). The same figures admit() holds the limits to."""
        limits = self.limits_of(tenant)
        with self._lock:
            state = self._tenants.get(tenant) or TenantWindow()
            state.expire(self.clock(), self.running_ttl_s)
            if tenant in self._tenants and state.idle():
                del self._tenants[tenant]
            return {
                "requests": None if limits.requests_per_minute is None else len(state.admitted),
                "tokens": None if limits.tokens_per_minute is None else state.charged,
                "running": len(state.running),
            }


def _refusals(limits: Limits, state: TenantWindow, tokens: int, now: float) -> list:
    """(limit, message, seconds until it could admit) for each limit refusing the request."""
    found = []
    most, running = limits.concurrent_requests, len(state.running)
    if most is not None and running >= most:
        message = f"concurrency limit reached: {running} requests running, {most} allowed at once"
        found.append(("concurrent", message, CONCURRENT_RETRY_S))
    most, admitted = limits.requests_per_minute, len(state.admitted)
    if most is not None and admitted >= most:
        # Admits again once the oldest admitted - most + 1 have left the window.
        free_at = state.admitted[admitted - most] + WINDOW_S
        message = f"rate limit reached: {most} requests per minute"
        found.append(("requests", message, free_at - now))
    most = limits.tokens_per_minute
    if most is not None and tokens > most:
        message = (
            f"this request is larger than the tokens-per-minute limit: it reserves {tokens} "
            f"tokens (prompt + max_tokens), the limit is {most}; lower max_tokens or the prompt"
        )
        found.append(("tokens", message, math.inf))  # no retry lets it in
    elif most is not None and state.charged + tokens > most:
        message = (
            f"rate limit reached: {most} tokens per minute; {state.charged} used or reserved "
            f"in the last minute, this request reserves {tokens}"
        )
        found.append(("tokens", message, tokens_free_at(state, most - tokens) - now))
    return found
