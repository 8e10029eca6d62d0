"""Faults on the served path: one of two ModelServer replicas killed through Ray while it
streams, and the other one holds the port.

The killed replica's own connections die with it: a stream it served is cut (the `openai`
client's APIConnectionError, test_faults.py), and one that the other replica forwarded to
it ends with an error event, then [DONE]. No stream hangs. Meanwhile every connection
reaches the surviving replica, which answers every model within BACK_S of the kill, and
the replica Serve starts in place of the killed one serves too once it has bound the port.
The demo kit, two replicas of half a CPU, in a Ray of this module's own (its temp dir and
HOME), stopped with serve.shutdown() and ray.shutdown(), never `ray stop`.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.serving.deploy.demo_served import (
    PROMPT,
    STREAM_TIMEOUT_S,
    Stream,
    write_demo_config,
)
from tests.serving.deploy.faults import (
    answered_again,
    figures,
    fresh_replica,
    kill,
    model_server_replicas,
    running,
)
from tests.serving.deploy.served import free_port, serving

pytestmark = pytest.mark.slow

REPLICAS = 2
LONG = 400  # tokens: a stream that is still running when its replica is killed
CUT_S = 5.0  # a stream the killed replica carried ends within this of the kill
BACK_S = 10.0  # every model answers within this of the kill, from the surviving replica
BASE_TRIES = (
    40  # base-model requests, each on its own connection, until one reaches the fresh replica
)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("survivor")
    port = free_port()
    config = write_demo_config(root, port, num_replicas=REPLICAS, num_cpus=0.5)
    with serving(config, port, root / "home") as url:
        yield url


def ended_on_the_killed_replica(s: Stream) -> bool:
    """Whether the stream ended as one the killed replica carried: cut, or with its error
    event then [DONE]; one served by the survivor alone ends whole."""
    if s.failure is not None:
        assert isinstance(s.failure, httpx.RemoteProtocolError), repr(s.failure)
        return True
    assert s.events[-1] == "[DONE]", s.events[-3:]
    last = json.loads(s.events[-2])
    if "error" in last:
        error = last["error"]
        assert error["type"] == "server_error" and "Traceback" not in error["message"], error
        return True
    assert last["usage"]["completion_tokens"] > 0, s.events[-3:]  # whole, to its usage
    return False


def test_a_killed_replica_s_peer_holds_the_port_and_its_successor_serves(url):
    before = set(model_server_replicas())
    assert len(before) == REPLICAS
    models = ["demo:upper", "demo:rot13", "demo"] * 2
    started = threading.Barrier(len(models) + 1, timeout=STREAM_TIMEOUT_S)
    streams = [Stream(url, model, LONG, started) for model in models]
    for s in streams:
        s.start()
    started.wait()  # every stream is mid-way
    by_replica = running(url)
    victim = max(by_replica, key=by_replica.get)  # the replica whose engine runs the most
    killed = kill(victim)

    # Every connection reaches the survivor: none is refused, and every model answers.
    back = answered_again(url, killed, BACK_S)
    print(f"running by replica {dict(by_replica)}; answered after the kill: {back}")
    assert back.refused == 0, back
    # /readyz tells whether the replica that answers takes requests, not whether all do.
    for _ in range(3):
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200

    cut_short = 0
    for s in streams:
        s.join(STREAM_TIMEOUT_S)
        assert not s.is_alive(), f"a stream ({s.model}) hangs"
        if ended_on_the_killed_replica(s):
            cut_short += 1
            assert s.ended - killed < CUT_S, (s.model, s.ended - killed, s.failure)
    assert cut_short >= 1, "no stream ran on the killed replica"  # else nothing was tested

    # Serve starts a replica in place of the killed one; a base-model request carries no
    # routing id, so it is served by the replica whose listener the kernel hands it to.
    fresh = fresh_replica(url, before - {victim}, REPLICAS, timeout=60)
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    for _ in range(BASE_TRIES):
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        if figures(url, "loraserve_adapter_arrivals")[fresh]:
            break
    else:
        pytest.fail(f"the fresh replica {fresh} served none of {BASE_TRIES} base requests")
