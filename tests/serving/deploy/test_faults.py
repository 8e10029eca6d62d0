"""Faults on the served path: the one ModelServer replica killed through Ray while it streams.

A replica serves its clients' connections itself, so they die with it: each stream is cut
at once, which the `openai` client reports as APIConnectionError, or as its HTTP library's
RemoteProtocolError in the versions that leave a cut mid-stream unwrapped (never a hang), and the
port is refused until Serve has started a new replica, which binds it and serves every
model, its adapters loaded again. How soon (a target of 10 s) is bench/faults.py's figure. Two replicas, where the other
one holds the port meanwhile, are test_faults_survivor.py's. The demo kit, in a Ray of this
module's own (its temp dir and HOME), stopped with serve.shutdown() and ray.shutdown(),
never `ray stop`.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time

import openai
import pytest

from tests.serving.deploy.demo_served import STREAM_TIMEOUT_S, ClientStream, write_demo_config
from tests.serving.deploy.faults import (
    answered_again,
    figures,
    fresh_replica,
    kill,
    model_server_replicas,
    refused,
)
from tests.serving.deploy.served import free_port, serving

pytestmark = pytest.mark.slow

# A connection cut mid-stream, as the client reports it: openai 3.3 (where the dev extras'
# instructor holds it) leaves its HTTP library's error (httpx2's) unwrapped; later versions
# wrap it as APIConnectionError
CUT = (openai.APIConnectionError, *(importlib.import_module(m).RemoteProtocolError
                                    for m in ("httpx", "httpx2") if importlib.util.find_spec(m)))  # fmt: skip
LONG = 400  # tokens: a stream that is still running when its replica is killed
CUT_S = 5.0  # a stream of the killed replica ends within this of the kill
# A lone replica comes back (Serve notices the death at its next health check, then starts
# and builds a new replica) well within this: a bound against a hang, not the target, which
# bench/faults.py measures on a quiet host.
BACK_S = 60.0


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    port = free_port()
    with serving(write_demo_config(root, port), port, root / "home") as url:
        yield url


def test_a_killed_lone_replica_cuts_its_streams_and_comes_back_with_its_adapters(url):
    (victim,) = model_server_replicas()
    models = ["demo:upper", "demo:rot13", "demo", "demo:upper"]
    started = threading.Barrier(len(models) + 1, timeout=STREAM_TIMEOUT_S)
    streams = [ClientStream(url, model, LONG, started) for model in models]
    for s in streams:
        s.start()
    started.wait()  # every stream has its first token: all are mid-stream on the replica
    killed = kill(victim)
    while not refused(url):  # ray.kill returns before the process is gone
        assert time.monotonic() - killed < CUT_S, "the port still accepts with no replica alive"
        time.sleep(0.01)
    for s in streams:
        s.join(STREAM_TIMEOUT_S)
        assert not s.is_alive(), "a stream of the killed replica hangs"
        assert isinstance(s.failure, CUT), repr(s.failure)
        assert s.ended - killed < CUT_S and len(s.events) < LONG, (s.ended - killed, s.events)

    back = answered_again(url, killed, BACK_S)
    print(f"answered again after the kill (s): {back}")  # shown with -s
    # The new replica serves (the only one there is), with both adapters loaded again.
    fresh = fresh_replica(url, {victim}, 1, timeout=30)
    assert figures(url, "loraserve_adapter_loads")[fresh] >= 2
