"""OpenAI's x-ratelimit-* headers for an answer, from a tenant's limits and its window.

Only the limits that are set have headers; a reset is the time until the window frees its
next unit, written in Go's duration style as OpenAI writes it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from serving.usage.tenant_window import WINDOW_S, TenantWindow

if TYPE_CHECKING:
    from serving.usage.limits import Limits

Headers = tuple[tuple[str, str], ...]


def ratelimit_headers(limits: Limits, state: TenantWindow, now: float) -> Headers:
    """OpenAI's x-ratelimit-* headers for the limits that are set, in OpenAI's order."""
    requests, tokens = limits.requests_per_minute, limits.tokens_per_minute
    limit, remaining, reset = [], [], []
    if requests is not None:
        oldest = state.admitted[0] if state.admitted else now - WINDOW_S
        limit.append(("x-ratelimit-limit-requests", str(requests)))
        remaining.append(
            ("x-ratelimit-remaining-requests", str(max(0, requests - len(state.admitted))))
        )
        reset.append(("x-ratelimit-reset-requests", duration(oldest + WINDOW_S - now)))
    if tokens is not None:
        oldest = state.charges[0].time if state.charges else now - WINDOW_S
        limit.append(("x-ratelimit-limit-tokens", str(tokens)))
        remaining.append(("x-ratelimit-remaining-tokens", str(max(0, tokens - state.charged))))
        reset.append(("x-ratelimit-reset-tokens", duration(oldest + WINDOW_S - now)))
    return (*limit, *remaining, *reset)


def duration(seconds: float) -> str:
    """A wait in Go's duration style, as OpenAI writes resets: "0s", "250ms", "1.5s", "6m0s"."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))  # rounded up: waiting that long suffices
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    minutes, ms = divmod(ms, 60_000)
    text = f"{ms // 1000}" + (f".{ms % 1000:03d}".rstrip("0") if ms % 1000 else "")
    return f"{minutes}m{text}s" if minutes else f"{text}s"
