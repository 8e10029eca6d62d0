"""Workers-AI batches (?queueRequest=true): mixed adapters, each result equal to the request run
alone, an unknown adapter failing its item only, tenants kept apart, bad input refused."""

import time

import httpx
import pytest

from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, serve

AUTH = {"Authorization": f"Bearer {ACME}"}
ADAPTERS = [None, "upper", "rot13", "mlp"]
PROMPTS = ["hello there", "the cat sat", "a b c d", "one two three", "zz top", "why not"]


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("queue"), max_batch_bytes=64 * 1024) as s:
        yield s


def post(served, body, *, queue=False, key=ACME):
    url = f"{served.url}/ai/run/{MODEL_ID}" + ("?queueRequest=true" if queue else "")
    return httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def wait_done(served, request_id, key=ACME, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = post(served, {"request_id": request_id}, key=key)
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        if result["status"] in ("done", "cancelled"):
            return result
        assert result["status"] in ("queued", "running")
        time.sleep(0.2)
    raise AssertionError(f"batch {request_id} did not finish")


def test_mixed_adapters_equal_direct_generation_and_an_unknown_adapter_fails_alone(served):
    items = []
    for i in range(200):
        item = {"prompt": PROMPTS[i % len(PROMPTS)] + f" {i}", "max_tokens": 4, "temperature": 0}
        adapter = ADAPTERS[i % 4] if i % 50 != 7 else "nobody-has-this"
        if adapter:
            item["lora"] = adapter
        items.append({**item, "external_reference": f"ref-{i}"})
    r = post(served, {"requests": items}, queue=True)
    assert r.status_code == 200, r.text
    queued = r.json()["result"]
    assert queued["status"] == "queued" and queued["model"] == MODEL_ID
    result = wait_done(served, queued["request_id"])
    responses = result["responses"]
    assert [x["id"] for x in responses] == list(range(200))
    assert [x["external_reference"] for x in responses] == [f"ref-{i}" for i in range(200)]
    failed = [x["id"] for x in responses if not x["success"]]
    assert failed == [7, 57, 107, 157]
    assert result["failed"] == 4 and result["completed"] == 196
    for i in failed:
        assert responses[i]["errors"][0]["code"] == 404
        assert "nobody-has-this" in responses[i]["errors"][0]["message"]
    for i in range(0, 200, 13):  # spot-check against the engine alone, greedy
        if i in failed:
            continue
        ids = served.chat_ids([{"role": "user", "content": items[i]["prompt"]}])
        _, want = served.reference(ids, items[i].get("lora"), 4)
        assert responses[i]["result"]["response"] == want, i
    total = sum(x["result"]["usage"]["completion_tokens"] for x in responses if x["success"])
    assert result["usage"]["completion_tokens"] == total


def test_another_tenants_request_id_reads_as_unknown(served):
    r = post(served, {"requests": [{"prompt": "hi", "max_tokens": 1}]}, queue=True)
    request_id = r.json()["result"]["request_id"]
    theirs = post(served, {"request_id": request_id}, key=GLOBEX)
    never = post(served, {"request_id": "batch_000000000000000000000000"}, key=GLOBEX)
    assert theirs.status_code == never.status_code == 404
    assert theirs.json()["errors"][0]["message"].replace(request_id, "X") == never.json()["errors"][
        0
    ]["message"].replace("batch_000000000000000000000000", "X")
    wait_done(served, request_id)


@pytest.mark.parametrize(
    ("body", "queue", "message"),
    [
        ({"requests": []}, True, "the batch has no requests"),
        ({"requests": [{"prompt": "x"}]}, False, "?queueRequest=true"),
        ({"prompt": "x"}, True, "requests"),
        ({"requests": [{"prompt": "x"}, {"prompt": "y", "messages": []}]}, True, "requests.1"),
        ({"requests": [{"prompt": "x", "stream": True}]}, True, "stream"),
        ({"requests": [{"prompt": "x", "bogus": 1}]}, True, "bogus"),
        ({"request_id": "batch_1", "prompt": "x"}, False, "request_id"),
    ],
)
def test_bad_submissions_are_refused_naming_the_problem(served, body, queue, message):
    r = post(served, body, queue=queue)
    assert r.status_code == 400, r.text
    assert message in r.json()["errors"][0]["message"]


def test_a_payload_over_the_batch_limit_is_refused_with_the_limit(served):
    big = [{"prompt": "x" * 1000} for _ in range(100)]  # ~100 KB over the 64 KiB limit
    r = post(served, {"requests": big}, queue=True)
    assert r.status_code == 413
    message = r.json()["errors"][0]["message"]
    assert "0.0625 MiB" in message and "batch.max_payload_mb" in message


def test_a_too_long_prompt_fails_its_item_only(served):
    long = " ".join(["word"] * 400)  # far beyond the served max_model_len of 96 tokens
    items = [{"prompt": "short", "max_tokens": 2, "temperature": 0}, {"prompt": long, "raw": True}]
    r = post(served, {"requests": items}, queue=True)
    result = wait_done(served, r.json()["result"]["request_id"])
    ok, bad = result["responses"]
    assert ok["success"] and not bad["success"]
    direct = post(served, items[1])
    assert direct.status_code == 400
    assert bad["errors"] == [{"code": 400, "message": direct.json()["errors"][0]["message"]}]


@pytest.mark.parametrize(
    ("query", "limit"), [("queueRequest=1", "batch"), ("x=queuerequest=true", "body")]
)
def test_the_batch_limit_applies_to_exactly_the_queued_form(served, query, limit):
    """?queueRequest=1 is queued (FastAPI reads it as true), so it has the batch limit; a
    query that merely contains the words is an ordinary request with the ordinary limit."""
    big = "x" * (70 * 1024)  # over the 64 KiB batch limit, under the 1 MiB body limit
    r = httpx.post(f"{served.url}/ai/run/{MODEL_ID}?{query}", json={"requests": [{"prompt": big}]},
                   headers=AUTH, timeout=60)  # fmt: skip
    if limit == "batch":
        assert r.status_code == 413 and "batch.max_payload_mb" in r.text
    else:
        assert r.status_code == 400 and "?queueRequest=true" in r.text


@pytest.mark.parametrize("route", ["/v1/batches", "/v1/responses"])
@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ('{"k": "\\ud800"}', "surrogate"),
        ('{"\\ud800": "v"}', "surrogate"),
        ("{" + ", ".join(f'"k{i}": "v"' for i in range(17)) + "}", "at most 16"),
        ('{"' + "k" * 5000 + '": "v"}', "at most 64 characters, not 5000"),
        ('{"k": "' + "v" * 600 + '"}', "at most 512 characters, not 600"),
    ],
)  # fmt: skip
def test_metadata_that_is_not_short_unicode_text_is_refused(served, route, metadata, message):
    body = ('{"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "model": "demo", '
            f'"input": "hi", "metadata": {metadata}}}').encode()  # fmt: skip
    r = httpx.post(f"{served.url}{route}", content=body, timeout=30,
                   headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert len(r.content) < 1000  # a long key is not echoed whole
