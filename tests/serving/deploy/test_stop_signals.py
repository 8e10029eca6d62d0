"""The stop handler never waits on a lock its own thread may hold.

A signal runs its handler in the main thread, between two bytecodes of whatever it was
doing; `loraserve serve` spends its life in Event.wait(0.5) on the very event the handler
sets, and Event.wait holds that event's lock each time it wakes to check. A handler that
took the lock there would wait on itself forever: Ctrl-C would hang the server.
"""

import signal
import threading

from serving.deploy.launch import _StopSignals


def test_a_signal_while_the_waiter_holds_the_event_lock_still_stops(monkeypatch):
    # Run in a thread here, so that a hang fails the test; signal.signal (the handler's
    # re-arming of Ctrl-C) works only in the main thread, and is not what is checked.
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)
    stop = _StopSignals()
    returned = threading.Event()

    def main_thread_at_the_wrong_moment():
        with stop.requested._cond:  # as Event.wait holds it between its timeout and return
            stop._on_signal(signal.SIGTERM, None)
        returned.set()

    worker = threading.Thread(target=main_thread_at_the_wrong_moment, daemon=True)
    worker.start()
    assert returned.wait(5), "the handler waited on a lock its own thread held"
    assert stop.requested.wait(5)
