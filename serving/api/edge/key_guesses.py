"""Slows API key guessing: a client that sends too many wrong keys is refused for a while.

A client is the address its connection comes from (behind a proxy, the proxy's: a header
such as X-Forwarded-For is the client's to write). Its wrong keys are counted in a window
of WINDOW_S seconds that opens at the first; once LIMIT are counted, every key it sends
gets 429 with Retry-After until the window closes, before the key is compared. A right key
resets no count, its client's or another's: holding one key buys no guesses at the others.
At most MAX_CLIENTS clients are remembered; the one whose last wrong key is oldest is
forgotten first, so memory stays bounded whoever calls.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

LIMIT = 20  # wrong keys a client may send per window
WINDOW_S = 60.0
MAX_CLIENTS = 10_000


class KeyGuesses:
    """Each client's wrong keys in its current window; safe to share between threads."""

    def __init__(
        self,
        limit: int = LIMIT,
        window_s: float = WINDOW_S,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window_s, self.max_clients = limit, window_s, max_clients
        self._clock = clock
        self._lock = threading.Lock()
        # client -> (when its window opened, wrong keys in it), least recently wrong first
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until client may send a key again; None if it may now."""
        with self._lock:
            opened, count = self._windows.get(client, (0.0, 0))
            left = opened + self.window_s - self._clock()
        return math.ceil(left) if count >= self.limit and left > 0 else None

    def wrong(self, client: str) -> None:
        """Count a wrong key from client."""
        with self._lock:
            now = self._clock()
            opened, count = self._windows.pop(client, (now, 0))
            if now - opened >= self.window_s:
                opened, count = now, 0
            self._windows[client] = (opened, count + 1)
            while len(self._windows) > self.max_clients:
                self._windows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._windows)
