"""A generator stub whose requests run until released, and the HTTP helpers the rate-limit
and charging tests share."""

import asyncio
import threading

from fastapi.testclient import TestClient

from serving.api import create_app
from serving.engine.request import RequestOutput
from tests.serving.api.served import MODEL_ID, stub_settings


def auth(key):
    return {"Authorization": f"Bearer {key}"}


class Held:
    """A generator whose requests stay running until `release` is set; counts them."""

    def __init__(self):
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self.started = 0

    async def generate(self, request, *, session=None):
        self.prompt_len = len(request.prompt_token_ids)
        self.max_tokens = request.sampling.max_tokens
        self.running += 1
        self.started += 1
        self.most = max(self.most, self.running)
        try:
            yield RequestOutput(request.request_id, (1,), "a", False, None, 3, 1)
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            yield RequestOutput(request.request_id, (2,), "b", True, "length", 3, 2)
        finally:
            self.running -= 1

    async def figures(self):
        return []

    async def ready(self):
        return True


def client_for(world, tmp_path, limits, generator=None):
    generator = generator or Held()
    generator.release.set()
    settings = stub_settings(world, tmp_path, limits_of=lambda t: limits.get(t, {}))
    return TestClient(create_app(generator, settings), raise_server_exceptions=False), generator


def post(client, key, max_tokens=4, path="/v1/completions"):
    body = {"model": MODEL_ID, "prompt": "hi", "max_tokens": max_tokens}
    if path.startswith("/ai"):
        body = {"prompt": "hi", "raw": True, "max_tokens": max_tokens}
    return client.post(path, json=body, headers=auth(key))
