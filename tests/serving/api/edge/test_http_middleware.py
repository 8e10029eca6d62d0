"""Every middleware of ours hands a non-HTTP scope (lifespan, websocket) to its app as it came,
and sees HTTP requests itself: checked on each."""

import asyncio

import pytest

from serving.api.edge.body_limits import BodyLimit
from serving.api.edge.gate import Gate
from serving.api.edge.http_middleware import HttpMiddleware
from serving.api.edge.keys import KeyRing
from serving.api.edge.request_id import RequestId


def _middleware(name, app):
    """The middleware called name around app."""
    if name == "body_limit":
        return BodyLimit(app, max_body_bytes=1)
    return Gate(app, KeyRing({})) if name == "gate" else RequestId(app)


async def _nothing():
    raise AssertionError("a passed-by scope's messages are the app's to read")


async def _discard(message):
    raise AssertionError("a passed-by scope's answers are the app's to send")


@pytest.mark.parametrize("kind", ["lifespan", "websocket"])
@pytest.mark.parametrize("name", ["request_id", "body_limit", "gate"])
def test_a_scope_that_is_not_http_reaches_the_app_untouched(name, kind):
    seen = []

    async def app(scope, receive, send):
        seen.append((scope, receive, send))

    scope = {"type": kind, "headers": [(b"x-request-id", b"\x00")]}
    asyncio.run(_middleware(name, app)(scope, _nothing, _discard))
    assert seen == [(scope, _nothing, _discard)]
    assert scope == {"type": kind, "headers": [(b"x-request-id", b"\x00")]}


def test_an_http_request_is_the_middlewares_own():
    handled = []

    class Seen(HttpMiddleware):
        async def handle(self, scope, receive, send):
            handled.append(scope["path"])

    async def app(scope, receive, send):
        raise AssertionError("handle decides whether the app sees it")

    asyncio.run(Seen(app)({"type": "http", "path": "/x"}, _nothing, _discard))
    assert handled == ["/x"]
