"""`loraserve serve` (its replicas serve HTTP themselves): a client that leaves a stream is
billed what it was sent. Serve cancels the request, and with it every call the request has
in flight, the Tenancy call that records the usage among them; it is made outside the
request, so it lands. The server runs as test_stop.py runs it, in a session of its own.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.serving.deploy.demo_served import PROMPT, STREAM_TIMEOUT_S, launched, write_demo_config
from tests.serving.deploy.served import free_port, wait_ready

pytestmark = pytest.mark.slow


def test_a_stream_its_client_leaves_is_billed(tmp_path):
    port = free_port()
    config = write_demo_config(tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    with launched(tmp_path, config) as (proc, log):
        wait_ready(url)
        before = _used(url)
        body = {"model": "demo", "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 200, "stream": True, "temperature": 0}  # fmt: skip
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                          timeout=STREAM_TIMEOUT_S) as r:  # fmt: skip
            assert r.status_code == 200
            tokens = 0
            for line in r.iter_lines():
                tokens += line.startswith("data:")
                if tokens == 5:  # the first event holds the role, no token
                    break
        deadline = time.monotonic() + 20
        while (now := _used(url)) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        requests, completion = (a - b for a, b in zip(now, before, strict=True))
        assert requests == 1 and 4 <= completion < 200, (now, before, log.read_text()[-2000:])
        proc.send_signal(signal.SIGINT)
        proc.wait(90)


def _used(url: str) -> tuple[int, int]:
    rows = httpx.get(f"{url}/v1/usage", timeout=30).json()["data"]
    return (sum(r["interactive"]["requests"] for r in rows),
            sum(r["interactive"]["completion_tokens"] for r in rows))  # fmt: skip
