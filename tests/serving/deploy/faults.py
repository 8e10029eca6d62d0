"""What the fault tests read of the demo app served on Ray: its ModelServer replicas, the
figures each reports to /metrics, and when every model answers again after a kill."""

from __future__ import annotations

import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.deploy.demo_served import PROMPT

MODELS = ("demo:upper", "demo:rot13", "demo")  # the demo kit's adapters, and the base
ANSWER_TOKENS = 8


def model_server_replicas() -> dict[str, str]:
    """The app's live ModelServer replicas: replica id (as /metrics labels it) -> actor name."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    # Serve names a replica's actor SERVE_REPLICA::<app>#<deployment>#<replica id>.
    return {
        n.rsplit("#", 1)[1]: n
        for n in names
        if n.startswith("SERVE_REPLICA::") and "#ModelServer#" in n
    }


def kill(replica: str) -> float:
    """ray.kill the replica (its id); when it was killed (time.monotonic())."""
    actor = ray.get_actor(model_server_replicas()[replica], namespace="serve")
    ray.kill(actor)
    return time.monotonic()


def figures(url: str, family: str) -> Counter:
    """replica id -> the family's value (its samples summed), from every replica's figures."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values = Counter()
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for s in f.samples:
                if not s.name.endswith("_created"):
                    values[s.labels["replica"]] += s.value
    return values


def running(url: str) -> Counter:
    """replica id -> requests running on its engine; every live replica is listed."""
    return figures(url, "loraserve_num_requests_running")


def refused(url: str) -> bool:
    """Whether a connection to the url's host and port is refused now."""
    where = urlsplit(url)
    with socket.socket() as s:
        try:
            s.connect((where.hostname, where.port))
        except ConnectionRefusedError:
            return True
    return False


@dataclass
class Answered:
    """How the models' next requests went: seconds from `since` to each one's answer, and
    what came before it (refused connections, other answers)."""

    seconds: dict[str, float] = field(default_factory=dict)
    refused: int = 0
    others: list[str] = field(default_factory=list)


def answered_again(url: str, since: float, within: float) -> Answered:
    """Each of MODELS asked until it answers 200 with its tokens, all within `within` s of
    `since`; a refused connection or any other answer is noted and asked again."""
    seen = Answered()
    for model in MODELS:
        body = {"model": model, "prompt": PROMPT, "max_tokens": ANSWER_TOKENS, "temperature": 0}
        while True:
            left = since + within - time.monotonic()
            if left <= 0:
                pytest.fail(f"{model} got no answer within {within} s: {seen}")
            try:
                # A connection of its own: the kernel picks a listening replica for each.
                answer = httpx.post(f"{url}/v1/completions", json=body, timeout=left)
            except httpx.ConnectError:
                seen.refused += 1
            except httpx.TransportError as exc:
                seen.others.append(f"{model}: {exc!r}")
            else:
                if answer.status_code == 200:
                    assert answer.json()["usage"]["completion_tokens"] == ANSWER_TOKENS
                    seen.seconds[model] = time.monotonic() - since
                    break
                seen.others.append(f"{model}: {answer.status_code} {answer.text[:200]}")
            time.sleep(0.1)
    return seen


def fresh_replica(url: str, before: set[str], num_replicas: int, timeout: float) -> str:
    """The id of the replica Serve started in place of a killed one, once it reports figures."""
    deadline = time.monotonic() + timeout
    while True:
        fresh = set(running(url)) - before
        if fresh and len(model_server_replicas()) == num_replicas:
            (replica,) = fresh
            return replica
        assert time.monotonic() < deadline, "Ray Serve did not bring a replica back"
        time.sleep(0.5)
