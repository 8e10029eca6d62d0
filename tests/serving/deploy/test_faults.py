"""Faults on the served path: a ModelServer replica killed through Ray while it streams.

Its clients get a clean error event (never a hang or a cut stream: the proxy runs
serving.deploy.stream_end), Ray Serve starts a new replica, and the next requests succeed
on it with their adapters loaded again. One replica on the demo kit, in a Ray of this
module's own (its temp dir and HOME), stopped with serve.shutdown() and ray.shutdown(),
never `ray stop`.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import ray

from tests.serving.deploy.demo_served import (
    ADAPTERS,
    PROMPT,
    STREAM_TIMEOUT_S,
    Stream,
    write_demo_config,
)
from tests.serving.deploy.served import free_port, serving, wait_ready

pytestmark = pytest.mark.slow

LONG = 400  # tokens: a stream that is still running when its replica is killed


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    port = free_port()
    with serving(write_demo_config(root, port), port, root / "home") as url:
        yield url


def model_server_replicas() -> list[str]:
    """The actor names of the app's live ModelServer replicas."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return sorted(n for n in names if n.startswith("SERVE_REPLICA::") and "ModelServer" in n)


def replica_ids(url: str) -> set[str]:
    """The replicas that report engine figures to /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        line.split('replica="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("loraserve_num_requests_running{")
    }


def test_killed_replica_ends_its_streams_cleanly_and_comes_back(url):
    (victim,) = model_server_replicas()
    before = replica_ids(url)
    models = ["demo:upper", "demo:rot13", "demo", "demo:upper"]
    started = threading.Barrier(len(models) + 1, timeout=STREAM_TIMEOUT_S)
    streams = [Stream(url, model, LONG, started) for model in models]
    for s in streams:
        s.start()
    started.wait()  # every stream has its first token: all are mid-stream on the replica
    ray.kill(ray.get_actor(victim, namespace="serve"))
    for s in streams:
        s.join(STREAM_TIMEOUT_S)
        assert not s.is_alive(), "a stream of the killed replica hangs"
        assert s.failure is None, repr(s.failure)
        # A clean end: a complete body whose last events are the error, then [DONE], as when a
        # step fails (the status line went out with the first token); never a cut or a full
        # answer.
        assert s.events[-1] == "[DONE]", s.events[-3:]
        error = json.loads(s.events[-2])["error"]
        assert error["type"] == "server_error" and "Traceback" not in error["message"], error
        assert len(s.events) < LONG, "the stream ran to its end: the kill came too late"

    # Ray Serve starts a new replica; once ready, requests succeed with their adapters.
    deadline = time.monotonic() + 120
    while not model_server_replicas() or model_server_replicas() == [victim]:
        assert time.monotonic() < deadline, "Ray Serve did not bring a replica back"
        time.sleep(1)
    wait_ready(url)
    for model in ("demo:upper", "demo:rot13", "demo"):
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
    (fresh,) = replica_ids(url) - before  # the new replica serves, and loaded both adapters
    loads = httpx.get(f"{url}/metrics", timeout=30).text
    loaded = [
        line
        for line in loads.splitlines()
        if line.startswith("loraserve_adapter_loads") and f'replica="{fresh}"' in line
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in loaded) >= len(ADAPTERS), loaded
