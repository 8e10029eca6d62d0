"""One tenant's sliding 60 s window of a rate limiter: admissions, token charges, running.

What serving.usage.limits counts against a tenant's Limits: the admission times and the
token charges in (t - 60, t], oldest first, and the requests admitted and not yet
finished. expire() forgets what has left the window, and what has run past the TTL.
"""

from __future__ import annotations

from collections import OrderedDict, deque

WINDOW_S = 60.0
Ticket = tuple[int, int]  # (the admitting Limiter's random epoch, its count of admissions)


class Charge:
    """Tokens charged to the window at an admission's time: the reservation, then the use."""

    __slots__ = ("time", "tokens")

    def __init__(self, time: float, tokens: int) -> None:
        self.time, self.tokens = time, tokens


class TenantWindow:
    """One tenant's window and running requests."""

    __slots__ = ("admitted", "charged", "charges", "running")

    def __init__(self) -> None:
        self.admitted: deque[float] = deque()  # admission times in the window, oldest first
        self.charges: deque[Charge] = deque()  # token charges in the window, oldest first
        self.charged = 0  # the sum of charges' tokens
        # Unfinished tickets -> (admission time, charge), oldest first: admissions are made
        # under the lock in clock order, so the front is always the next to outlive the TTL.
        self.running: OrderedDict[Ticket, tuple[float, Charge | None]] = OrderedDict()

    def expire(self, now: float, running_ttl_s: float) -> None:
        """Forget what left the window (t - 60, t], and running tickets admitted TTL ago."""
        edge = now - WINDOW_S
        while self.admitted and self.admitted[0] <= edge:
            self.admitted.popleft()
        while self.charges and self.charges[0].time <= edge:
            self.charged -= self.charges.popleft().tokens
        born = now - running_ttl_s
        while self.running and next(iter(self.running.values()))[0] <= born:
            self.running.popitem(last=False)  # its charge stays, dated at its admission

    def idle(self) -> bool:
        return not (self.admitted or self.charges or self.running)


def tokens_free_at(state: TenantWindow, budget: int) -> float:
    """When the window's charges first fall to `budget` or less (the oldest leave first)."""
    left = state.charged
    for charge in state.charges:
        left -= charge.tokens
        if left <= budget:
            return charge.time + WINDOW_S
    return state.charges[-1].time + WINDOW_S  # not reached: all gone leaves 0 <= budget
