"""Cloudflare's own Python SDK against loraserve, base_url set to the server: runs with and
without `lora`, a stream, a finetune created and uploaded file by file then run by its id
and name, listings, the model catalogue, a queued batch, and errors the SDK parses."""

import json
import time

import cloudflare
import pytest
from cloudflare.types.ai import FinetuneCreateResponse, FinetuneListResponse
from cloudflare.types.ai.finetunes import AssetCreateResponse, PublicListResponse
from cloudflare.types.ai.models import SchemaGetResponse

from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve

ACCOUNT = "acme"  # ACME's tenant


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("cloudflare-sdk")) as s:
        yield s


def sdk(served, key=ACME) -> cloudflare.Cloudflare:
    return cloudflare.Cloudflare(api_token=key, base_url=served.url, max_retries=0)


def files_of(served, source: str) -> dict[str, bytes]:
    adapter = served.world.adapters[served.world.versions[source]]
    return {"adapter_config.json": adapter.config_bytes,
            "adapter_model.safetensors": adapter.weights_bytes}  # fmt: skip


def greedy(served, adapter, prompt="what is up", n=5) -> str:
    return served.reference(served.chat_ids([{"role": "user", "content": prompt}]), adapter, n)[1]


@pytest.mark.parametrize("lora", [None, "upper"])
def test_run_with_and_without_lora(served, lora):
    extra = {"lora": lora} if lora else {}
    result = sdk(served).ai.run(MODEL_ID, account_id=ACCOUNT, prompt="what is up",
                                max_tokens=5, temperature=0, **extra)  # fmt: skip
    assert result["response"] == greedy(served, lora)
    assert result["usage"]["completion_tokens"] == 5


def test_a_streamed_run(served):
    with sdk(served).ai.with_streaming_response.run(
        MODEL_ID, account_id=ACCOUNT, prompt="what is up", max_tokens=5, temperature=0,
        lora="rot13", stream=True,
    ) as response:  # fmt: skip
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert "".join(e["response"] for e in events) == greedy(served, "rot13")
    assert events[-1]["usage"]["completion_tokens"] == 5


def test_finetune_created_uploaded_and_run_by_id_and_name(served):
    client = sdk(served)
    made = client.ai.finetunes.create(account_id=ACCOUNT, model=MODEL_ID, name="sdk-upper",
                                      description="shouts")  # fmt: skip
    assert isinstance(made, FinetuneCreateResponse)
    assert (made.name, made.model, made.public) == ("sdk-upper", MODEL_ID, False)
    files = files_of(served, "upper")
    # half uploaded: never served, by id or by name
    done = client.ai.finetunes.assets.create(
        made.id, account_id=ACCOUNT, file=files["adapter_config.json"],
        file_name="adapter_config.json",
    )  # fmt: skip
    assert isinstance(done, AssetCreateResponse) and done.success
    for lora in (made.id, "sdk-upper"):
        with pytest.raises(cloudflare.NotFoundError):
            client.ai.run(MODEL_ID, account_id=ACCOUNT, prompt="x", lora=lora)
    client.ai.finetunes.assets.create(
        made.id, account_id=ACCOUNT, file=files["adapter_model.safetensors"],
        file_name="adapter_model.safetensors",
    )  # fmt: skip
    want = greedy(served, "upper")
    for lora in (made.id, "sdk-upper"):
        result = client.ai.run(MODEL_ID, account_id=ACCOUNT, prompt="what is up",
                               max_tokens=5, temperature=0, lora=lora)  # fmt: skip
        assert result["response"] == want
    # the SDK parses each listed finetune with its own type
    rows = client.ai.finetunes.list(account_id=ACCOUNT)
    assert all(isinstance(r, FinetuneListResponse) for r in rows)
    assert [(r.name, r.model) for r in rows if r.id == made.id] == [("sdk-upper", MODEL_ID)]
    # another account sees none of it
    other = sdk(served, GLOBEX)
    assert all(r.id != made.id for r in other.ai.finetunes.list(account_id="globex"))
    with pytest.raises(cloudflare.NotFoundError):
        other.ai.run(MODEL_ID, account_id="globex", prompt="x", lora=made.id)


def test_public_finetunes_are_listed_and_run_by_everyone(served):
    admin = sdk(served, ADMIN)
    made = admin.ai.finetunes.create(account_id="ops", model=MODEL_ID, name="sdk-public",
                                     public=True)  # fmt: skip
    for name, data in files_of(served, "mlp").items():
        admin.ai.finetunes.assets.create(made.id, account_id="ops", file=data, file_name=name)
    page = sdk(served, GLOBEX).ai.finetunes.public.list(account_id="globex")
    rows = list(page)
    assert all(isinstance(r, PublicListResponse) for r in rows)
    assert [r.id for r in rows if r.name == "sdk-public"] == [made.id]
    result = sdk(served, GLOBEX).ai.run(MODEL_ID, account_id="globex", prompt="what is up",
                                        max_tokens=5, temperature=0, lora=made.id)  # fmt: skip
    assert result["response"] == greedy(served, "mlp")


def test_models_search_and_schema(served):
    client = sdk(served)
    found = list(client.ai.models.list(account_id=ACCOUNT, search=MODEL_ID))
    assert [m["name"] for m in found] == [MODEL_ID]
    assert list(client.ai.models.list(account_id=ACCOUNT, search="no-such-model")) == []
    schema = client.ai.models.schema.get(account_id=ACCOUNT, model=MODEL_ID)
    assert isinstance(schema, SchemaGetResponse)
    assert {"prompt", "messages", "lora", "stream"} <= set(schema.input.to_dict()["properties"])


def test_a_queued_batch(served):
    client = sdk(served)
    queued = client.ai.run(MODEL_ID, account_id=ACCOUNT, extra_query={"queueRequest": "true"},
                           extra_body={"requests": [
                               {"prompt": "what is up", "max_tokens": 5, "temperature": 0,
                                "lora": "upper", "external_reference": "a"},
                               {"prompt": "what is up", "max_tokens": 5, "temperature": 0,
                                "external_reference": "b"}]})  # fmt: skip
    assert queued["status"] == "queued"
    deadline = time.monotonic() + 60
    while True:
        polled = client.ai.run(MODEL_ID, account_id=ACCOUNT,
                               extra_body={"request_id": queued["request_id"]})  # fmt: skip
        if "responses" in polled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    by_ref = {r["external_reference"]: r["result"]["response"] for r in polled["responses"]}
    assert by_ref == {"a": greedy(served, "upper"), "b": greedy(served, None)}


def test_errors_are_cloudflare_shaped_and_another_account_reads_as_none(served):
    client = sdk(served)
    with pytest.raises(cloudflare.NotFoundError) as theirs:
        client.ai.run(MODEL_ID, account_id="globex", prompt="x")
    with pytest.raises(cloudflare.NotFoundError) as nobody:
        client.ai.run(MODEL_ID, account_id="no-such-account", prompt="x")
    body = nobody.value.body
    assert body["success"] is False and body["result"] is None and body["messages"] == []
    assert body["errors"][0]["code"] == 404
    # the same answer, the account's own id aside
    assert theirs.value.body == json.loads(json.dumps(body).replace("no-such-account", "globex"))
    with pytest.raises(cloudflare.BadRequestError) as bad:
        client.ai.run(MODEL_ID, account_id=ACCOUNT, prompt="x", max_tokens=0)
    assert "max_tokens" in bad.value.body["errors"][0]["message"]
    with pytest.raises(cloudflare.AuthenticationError):
        cloudflare.Cloudflare(api_token="wrong", base_url=served.url, max_retries=0).ai.run(
            MODEL_ID, account_id=ACCOUNT, prompt="x"
        )


def test_the_account_api_as_the_sdk_reads_it(served):
    client = sdk(served, GLOBEX)
    assert client.user.tokens.verify().status == "active"
    assert client.accounts.tokens.verify(account_id="globex").status == "active"
    with pytest.raises(cloudflare.NotFoundError):
        client.accounts.tokens.verify(account_id=ACCOUNT)
    # the SDK pages until a page comes back empty: one account, then the end
    assert [m.account.id for m in client.memberships.list()] == ["globex"]
