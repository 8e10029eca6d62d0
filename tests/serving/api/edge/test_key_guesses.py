"""KeyGuesses: a client's wrong keys counted in a window, refused past the limit, memory capped."""

from serving.api.edge.key_guesses import KeyGuesses


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_client_past_the_limit_waits_for_its_window_to_close():
    clock = Clock()
    guesses = KeyGuesses(limit=3, window_s=60, clock=clock)
    for _ in range(2):
        guesses.wrong("10.0.0.1")
    assert guesses.retry_after("10.0.0.1") is None  # two of three: may still try
    clock.now += 10.5
    guesses.wrong("10.0.0.1")
    assert guesses.retry_after("10.0.0.1") == 50  # the window opened at the first wrong key
    assert guesses.retry_after("10.0.0.2") is None  # others are not held back
    clock.now += 49.0
    assert guesses.retry_after("10.0.0.1") == 1  # whole seconds, rounded up
    clock.now += 0.5
    assert guesses.retry_after("10.0.0.1") is None
    guesses.wrong("10.0.0.1")  # a new window, counted from one
    assert guesses.retry_after("10.0.0.1") is None


def test_memory_is_capped_forgetting_the_longest_quiet_client():
    clock = Clock()
    guesses = KeyGuesses(limit=2, window_s=60, max_clients=100, clock=clock)
    guesses.wrong("attacker")
    guesses.wrong("attacker")
    for n in range(99):
        guesses.wrong(f"10.0.{n // 256}.{n % 256}")
    assert len(guesses) == 100 and guesses.retry_after("attacker") == 60
    guesses.wrong("10.1.0.0")  # the 101st client: the oldest is forgotten
    assert len(guesses) == 100 and guesses.retry_after("attacker") is None
    for n in range(10_000):
        guesses.wrong(f"2001:db8::{n:x}")
    assert len(guesses) == 100
