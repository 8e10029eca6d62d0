"""What a request is charged over HTTP: a failed request is not metered but its tokens count
against its tenant's limit, and the charge is committed before the answer is sent."""

import asyncio
import dataclasses

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.engine.request import RequestOutput
from tests.serving.api.held import Held, auth, client_for, post
from tests.serving.api.served import GLOBEX, stub_settings


class FailsMidway(Held):
    """Each request yields a token, then fails (as an engine step fault would)."""

    async def generate(self, request, *, session=None):
        self.prompt_len = len(request.prompt_token_ids)
        yield RequestOutput(request.request_id, (1,), "a", False, None, 3, 1)
        yield RequestOutput(request.request_id, (), "", True, "error", 3, 2, error="boom")


def test_a_failed_request_is_not_metered_but_its_tokens_count_against_the_limit(world, tmp_path):
    failing = FailsMidway()
    failing.release.set()
    limits = {"globex": {"tokens_per_minute": 100}}
    settings = stub_settings(world, tmp_path, limits_of=lambda t: limits.get(t, {}))
    client = TestClient(create_app(failing, settings), raise_server_exceptions=False)
    assert post(client, GLOBEX).status_code == 500  # its answer carries no usage
    ok = Held()
    ok.release.set()
    client.app.state.context = dataclasses.replace(client.app.state.context, generator=ok)
    r = post(client, GLOBEX, max_tokens=4)
    assert r.status_code == 200
    # 3 + 2 tokens charged for the failed request, then this one's reservation
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 100 - 5 - (ok.prompt_len + 4)
    rows = client.get("/v1/usage", params={"group_by": "tenant"}, headers=auth(GLOBEX)).json()
    assert [row["interactive"]["requests"] for row in rows["data"]] == [1]  # the answered one
    text = client.get("/metrics", headers=auth("admin-key-0123")).text
    assert 'loraserve_tenant_requests_total{kind="interactive",tenant="globex"} 1.0' in text


class SlowFinish:
    """A tenancy whose finish takes a while, as a shared limiter behind a handle does."""

    def __init__(self, tenancy):
        self.tenancy, self.finished = tenancy, 0

    async def admit(self, tenant, tokens):
        return await self.tenancy.admit(tenant, tokens)

    async def finish(self, admission, record, tokens_used):
        await asyncio.sleep(0.2)
        await self.tenancy.finish(admission, record, tokens_used)
        self.finished += 1

    async def usage(self, **query):
        return await self.tenancy.usage(**query)


@pytest.mark.parametrize("failing", [False, True])
def test_a_request_is_charged_before_its_answer_is_sent(world, tmp_path, failing):
    generator = FailsMidway() if failing else Held()
    client, _ = client_for(world, tmp_path, {"globex": {"tokens_per_minute": 100}}, generator)
    context = client.app.state.context
    tenancy = SlowFinish(context.tenancy)
    client.app.state.context = dataclasses.replace(context, tenancy=tenancy)
    assert post(client, GLOBEX).status_code == (500 if failing else 200)
    assert tenancy.finished == 1
