"""PeerReplicas.forward over a stand-in handle: how a forwarded stream is asked for, ends,
is cancelled, and fails (the served tests cover the same through Ray, where it is timing that
decides whether a request is forwarded at all); and whose readiness a replica's app tells."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from serving.api.core.generator import QueueFull
from serving.deploy.ingress import PeerReplicas, ReplicaGenerator
from serving.engine.request import GenerateRequest, RequestOutput, SamplingParams

REQUEST = GenerateRequest("r1", (1, 2, 3), SamplingParams(max_tokens=4), "down@abc")


class Response:
    """A handle call's stream: `outputs`, then `then` (an exception), else no end at all."""

    def __init__(self, outputs, then: BaseException | None = None):
        self.outputs, self.then = list(outputs), then
        self.cancelled = False
        self.read = 0

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.read < len(self.outputs):
            self.read += 1
            return self.outputs[self.read - 1]
        if self.then is not None:
            raise self.then
        await asyncio.Event().wait()  # a stream that never ends by itself

    def cancel(self):
        self.cancelled = True


class Handle:
    """The ModelServer handle: records the options of the call and answers with `response`."""

    def __init__(self, response: Response):
        self.response = response
        self.options_seen: dict = {}
        self.requests: list = []

    def options(self, **options):
        self.options_seen = options
        return self

    @property
    def generate(self):
        return self

    def remote(self, request):
        self.requests.append(request)
        return self.response


def out(n: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r1", (n,), str(n), finished=finished)


async def collect(stream, limit: int | None = None) -> list[RequestOutput]:
    got = []
    async for o in stream:
        got.append(o)
        if limit is not None and len(got) == limit:
            break
    await stream.aclose()
    return got


def test_a_forward_streams_over_grpc_to_the_adapter_and_ends_at_its_finished_output():
    response = Response([out(1), out(2, finished=True)])  # and no end of stream after it
    handle = Handle(response)
    peers = PeerReplicas(handle)
    got = asyncio.run(asyncio.wait_for(collect(peers.forward(REQUEST, "down@abc")), 5))
    assert [o.new_token_ids for o in got] == [(1,), (2,)]
    assert handle.options_seen == {
        "stream": True, "multiplexed_model_id": "down@abc", "_by_reference": False,
    }  # fmt: skip
    assert handle.requests == [REQUEST]
    assert not response.cancelled  # it finished: nothing to abort


def test_leaving_a_forward_early_cancels_the_call():
    response = Response([out(1), out(2), out(3, finished=True)])
    peers = PeerReplicas(Handle(response))
    got = asyncio.run(collect(peers.forward(REQUEST, "down@abc"), limit=1))
    assert len(got) == 1
    assert response.cancelled  # the holder's engine aborts the request


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (ValueError("prompt too long"), ValueError),  # as gRPC hands the holder's on
        (QueueFull("9 waiting"), QueueFull),
        (RayTaskError("generate", "Traceback ...", ValueError("prompt too long")), ValueError),
        (RayTaskError("generate", "Traceback ...", QueueFull("9 waiting")), QueueFull),
        (BackPressureError(num_queued_requests=9, max_queued_requests=9), QueueFull),
    ],
)
def test_a_replica_refusal_arrives_as_the_api_knows_it(raised, expected):
    response = Response([], then=raised)
    peers = PeerReplicas(Handle(response))
    with pytest.raises(expected) as caught:
        asyncio.run(collect(peers.forward(REQUEST, "down@abc")))
    assert not isinstance(caught.value, RayTaskError)  # its own message, no traceback
    assert response.cancelled  # it never finished


class Server:
    """The ModelServer as ReplicaGenerator sees it: its own readiness, no ids held, the
    requests it served itself."""

    def __init__(self, ready: bool = True):
        self._ready = ready
        self.held: set[str] = set()
        self.served: list[tuple[str, str | None]] = []

    async def ready(self) -> bool:
        return self._ready

    async def serve_here(self, request: GenerateRequest, model_id: str | None):
        self.served.append((request.request_id, model_id))
        yield RequestOutput(request.request_id, (7,), "x", finished=True)


@pytest.mark.parametrize("alone", [True, False])
def test_a_lone_replica_serves_an_id_it_does_not_hold_itself(alone):
    # With peers, an id this replica lacks goes to the replica Ray routes it to; a lone
    # replica (one that has just replaced a dead one, say) has none to ask, and serves it.
    server, response = Server(), Response([RequestOutput("r", (9,), "y", finished=True)])
    generator = ReplicaGenerator(server, PeerReplicas(Handle(response)), 4, alone=alone)
    got = asyncio.run(collect(generator.generate(REQUEST)))
    assert got[0].new_token_ids == ((7,) if alone else (9,))
    assert server.served == ([(REQUEST.request_id, REQUEST.adapter)] if alone else [])


@pytest.mark.parametrize("own", [True, False])
def test_readiness_is_the_answering_replica_s_own(own):
    # A probe reaches the replica the kernel hands its connection to: that one answers for
    # itself, whatever its peers' state (the stand-in handle cannot even be broadcast to).
    generator = ReplicaGenerator(Server(own), PeerReplicas(Handle(Response([]))), 4)
    assert asyncio.run(generator.ready()) is own
