"""The prefix cache is no side channel: with keys, each tenant's requests carry its own cache
salt, so cached_tokens never tells one tenant what another sent; keyless, all share."""

import pickle

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.engine.request import RequestOutput
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve, stub_settings

TURN = [{"role": "user", "content": "hi"}]
ROUTES = [
    ("/v1/chat/completions", {"model": MODEL_ID, "messages": TURN}),
    ("/v1/completions", {"model": MODEL_ID, "prompt": "hi"}),
    (f"/ai/run/{MODEL_ID}", {"prompt": "hi"}),
]


class Recorder:
    """A generator that finishes every request at once, keeping what it was asked."""

    def __init__(self):
        self.requests = []

    async def generate(self, request, *, session=None):
        # pickled as a Ray handle ships it to a replica: the salt must survive the trip
        self.requests.append(pickle.loads(pickle.dumps(request)))
        yield RequestOutput(request.request_id, (1,), "x", True, "stop", 2, 1)

    async def figures(self):
        return []

    async def ready(self):
        return True


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize("stream", [False, True])
def test_each_tenant_salts_its_own_requests(world, tmp_path, path, body, stream):
    recorder = Recorder()
    client = TestClient(create_app(recorder, stub_settings(world, tmp_path)))
    for key in (ACME, GLOBEX, ADMIN):
        auth = {"Authorization": f"Bearer {key}"}
        assert client.post(path, json={**body, "stream": stream}, headers=auth).status_code == 200
    assert [r.cache_salt for r in recorder.requests] == ["acme", "globex", "ops"]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_keyless_server_does_not_salt(world, tmp_path, path, body):
    recorder = Recorder()
    settings = stub_settings(world, tmp_path, keys={})
    client = TestClient(create_app(recorder, settings), base_url="http://127.0.0.1")
    assert client.post(path, json=body).status_code == 200
    assert recorder.requests[0].cache_salt is None


PROMPT = "a question only acme should have asked"


def cached(served, key=None) -> int:
    body = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(served.url + "/v1/completions", json=body, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_another_tenants_guess_finds_nothing_in_the_cache(world, tmp_path):
    with serve(world, tmp_path) as served:
        assert cached(served, ACME) == 0
        assert cached(served, GLOBEX) == 0  # B's guess of A's prompt: no hit, nothing learnt
        assert cached(served, ACME) > 0  # A's own repeat hits


def test_a_keyless_server_shares_its_cache(world, tmp_path):
    with serve(world, tmp_path, keys={}) as served:
        assert cached(served) == 0 and cached(served) > 0
