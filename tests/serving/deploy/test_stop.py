"""`loraserve serve` stopped by SIGINT (Ctrl-C) with streams in flight: each one finishes,
to its last token and `[DONE]`, before the server exits 0; nothing is cut mid-way.

The server runs as a user runs it, in a session of its own with HOME and Ray's temp dir
under a temp folder; if it hangs, its own process group is killed, never `ray stop`.
"""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from tests.serving.deploy.demo_served import (
    PROMPT,
    STREAM_TIMEOUT_S,
    Stream,
    launched,
    write_demo_config,
)
from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow

MAX_TOKENS = 200  # long enough to be mid-stream at the signal, short of the 30 s drain
MODELS = ("demo:upper", "demo:rot13", "demo")
EXIT_TIMEOUT_S = 90  # the drain (replica.DRAIN_TIMEOUT_S) and Ray's shutdown


def test_sigint_lets_streams_in_flight_finish(tmp_path):
    port = free_port()
    config = write_demo_config(tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    with launched(tmp_path, config) as (proc, log):
        wait_ready(url)
        expected = {m: _complete(url, m) for m in MODELS}  # greedy: what each stream must say
        started = threading.Barrier(len(MODELS) + 1, timeout=STREAM_TIMEOUT_S)
        streams = [Stream(url, m, MAX_TOKENS, started) for m in MODELS]
        for s in streams:
            s.start()
        started.wait()  # every stream is mid-way
        proc.send_signal(signal.SIGINT)
        at_signal = [len(s.events) for s in streams]
        for s in streams:
            s.join(STREAM_TIMEOUT_S)
            assert not s.is_alive() and s.failure is None, (s.model, s.failure, log.read_text())
            assert s.events[-1] == "[DONE]", s.events[-3:]
            usage = json.loads(s.events[-2])["usage"]
            assert (s.text(), usage["completion_tokens"]) == expected[s.model], s.model
        # Else the signal came too late to test anything.
        assert any(n < len(s.events) for n, s in zip(at_signal, streams, strict=True))
        proc.wait(EXIT_TIMEOUT_S)
        assert proc.returncode == 0, log.read_text()


def _complete(url: str, model: str) -> tuple[str, int]:
    """The text and token count of model's greedy answer to PROMPT, not streamed."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=STREAM_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    done = answer.json()
    return done["choices"][0]["text"], done["usage"]["completion_tokens"]
