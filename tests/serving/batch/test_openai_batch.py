"""OpenAI's Files and Batch API through the official `openai` client: a batch's output equals
each body sent alone, an unknown adapter fails its line only, listing pages, cancelling keeps
what finished and runs nothing more, and the batch's tokens are metered as batch usage."""

import json
import time
from functools import partial

import httpx
import openai
import pytest

from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, serve

GREEDY = {"temperature": 0, "max_tokens": 3}
MODELS = [MODEL_ID, "upper", "rot13", "mlp", f"{MODEL_ID}:rot13"]
UNKNOWN = "nobody-has-this"
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
TOKENS = ("prompt_tokens", "completion_tokens", "cached_tokens")


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("openai-batch"), max_batch_bytes=64 * 1024) as s:
        yield s


def client(served, key=ACME) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0, timeout=60)


def line(custom_id, body, url=CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(lines) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def chat(model, i, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"say {i}"}], **GREEDY,
            **extra}  # fmt: skip


def start(c, lines, endpoint=CHAT, **kwargs):
    f = c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                            **kwargs)  # fmt: skip


def wait(c, batch_id, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = c.batches.retrieve(batch_id)
        if batch.status in ("completed", "cancelled"):
            return batch
        assert batch.status in ("in_progress", "cancelling"), batch.status
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not finish")


def read(c, file_id) -> list[dict]:
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()] if file_id else []


def test_chat_batch_equals_each_body_alone_and_an_unknown_adapter_fails_its_line(served):
    """Lines for the base model, three adapters by name and one as demo:adapter each answer
    what the same body answers sent alone (greedy), in file order with their custom_ids;
    the unknown adapter's line alone is in the error file, a 404 naming it; the counts,
    the metadata and the files' metadata agree."""
    c = client(served)
    bodies = {f"req-{i}": chat(UNKNOWN if i == 6 else MODELS[i % 5], i) for i in range(10)}
    upload = c.files.create(file=("mixed.jsonl", jsonl(line(k, b) for k, b in bodies.items())),
                            purpose="batch")  # fmt: skip
    assert upload.id.startswith("file-") and upload.purpose == "batch"
    assert upload.filename == "mixed.jsonl" and upload.status == "processed"
    stored = c.files.retrieve(upload.id)
    assert stored.bytes == upload.bytes == len(c.files.content(upload.id).read())
    meta = {"project": "tests", "run": "1"}
    batch = c.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h",
                             metadata=meta)  # fmt: skip
    assert batch.status == "in_progress" and batch.request_counts.total == 10
    assert (batch.endpoint, batch.input_file_id, batch.model) == (CHAT, upload.id, MODEL_ID)
    done = wait(c, batch.id)
    assert done.metadata == meta and done.completed_at and done.cancelled_at is None
    assert (done.request_counts.completed, done.request_counts.failed) == (9, 1)
    outputs, errors = read(c, done.output_file_id), read(c, done.error_file_id)
    assert [x["custom_id"] for x in outputs] == [k for k in bodies if k != "req-6"]
    for out in outputs:
        assert out["response"]["status_code"] == 200 and out["error"] is None
        got = out["response"]["body"]
        alone = c.chat.completions.create(**bodies[out["custom_id"]])
        assert got["choices"][0]["message"]["content"] == alone.choices[0].message.content
        assert got["usage"]["completion_tokens"] == alone.usage.completion_tokens
        assert got["usage"]["prompt_tokens"] == alone.usage.prompt_tokens
    (error,) = errors
    assert error["custom_id"] == "req-6" and error["response"]["status_code"] == 404
    assert UNKNOWN in error["response"]["body"]["error"]["message"]
    output_file = c.files.retrieve(done.output_file_id)
    assert output_file.bytes == len(c.files.content(done.output_file_id).read())


def test_completions_batch_equals_each_body_alone(served):
    """The /v1/completions endpoint: each line's text is what the body gets alone."""
    c = client(served)
    bodies = [{"model": m, "prompt": f"count {i}", **GREEDY} for i, m in enumerate(MODELS[:3])]
    done = wait(c, start(c, [line(f"c{i}", b, TEXT) for i, b in enumerate(bodies)], TEXT).id)
    assert done.endpoint == TEXT and done.error_file_id is None
    outputs = read(c, done.output_file_id)
    assert [x["custom_id"] for x in outputs] == ["c0", "c1", "c2"]
    for out, body in zip(outputs, bodies, strict=True):
        got = out["response"]["body"]["choices"][0]["text"]
        assert got == c.completions.create(**body).choices[0].text


def test_list_pages_newest_first_with_limit_and_after(served):
    """batches.list pages by limit and after, newest first, and auto-pagination walks every
    page; another tenant lists none of these batches."""
    c = client(served)
    ids = [start(c, [line("x", chat(MODEL_ID, i, max_tokens=1))]).id for i in range(3)]
    first = c.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    second = c.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == ids[0]
    walked = [b.id for b in c.batches.list(limit=2)]
    assert walked[:3] == ids[::-1] and len(walked) == len(set(walked))
    assert not set(ids) & {b.id for b in client(served, GLOBEX).batches.list(limit=100)}
    for batch_id in ids:
        wait(c, batch_id)


@pytest.mark.slow
def test_cancel_keeps_finished_items_and_runs_no_more(served):
    """Cancelling a slow batch midway: cancelling, then cancelled; what finished by then is
    in the output file; at most the items already running finish after the cancel, and
    once cancelled the counts stop changing and the engine is idle."""
    c = client(served)
    model = served.generator.engine.model
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.03)
        return forward(*args, **kwargs)

    model.forward = slow_forward
    try:
        batch = start(c, [line(f"s{i}", chat(MODELS[i % 4], i, max_tokens=4)) for i in range(80)])
        deadline = time.monotonic() + 60
        while c.batches.retrieve(batch.id).request_counts.completed < 2:
            assert time.monotonic() < deadline, "no item finished"
            time.sleep(0.02)
        cancel = c.batches.cancel(batch.id)
        assert cancel.status in ("cancelling", "cancelled") and cancel.cancelling_at
        done = wait(c, batch.id)
    finally:
        model.forward = forward
    counts = done.request_counts
    assert done.status == "cancelled" and done.cancelled_at and done.completed_at is None
    ended = counts.completed + counts.failed
    assert cancel.request_counts.completed <= counts.completed and counts.failed == 0
    assert ended <= cancel.request_counts.completed + 8 < counts.total  # 8: max_in_flight
    outputs = read(c, done.output_file_id)
    assert len(outputs) == counts.completed
    assert {x["custom_id"] for x in outputs} <= {f"s{i}" for i in range(80)}
    time.sleep(1.0)
    assert c.batches.retrieve(batch.id).request_counts == counts
    assert not served.generator.engine.scheduler.has_work()


def test_files_retrieve_content_and_delete(served):
    """An uploaded file reads back as uploaded, until deleted; then it is unknown."""
    c = client(served)
    content = jsonl([line("a", chat(MODEL_ID, 1))])
    f = c.files.create(file=("one.jsonl", content), purpose="batch")
    got = c.files.retrieve(f.id)
    assert (got.id, got.filename, got.bytes, got.purpose) == (f.id, "one.jsonl", len(content),
                                                              "batch")  # fmt: skip
    assert c.files.content(f.id).read() == content
    gone = c.files.delete(f.id)
    assert gone.deleted and gone.id == f.id
    for call in (c.files.retrieve, c.files.content, c.files.delete):
        with pytest.raises(openai.NotFoundError, match=f.id):
            call(f.id)


def test_batch_tokens_are_metered_as_batch_usage(served):
    """GET /v1/usage counts a finished batch's items under kind batch for its tenant, equal
    to the sum of the usage its output file carries; the failed line adds nothing."""
    c = client(served)

    def batch_usage():
        r = httpx.get(f"{served.url}/v1/usage", params={"group_by": "tenant"},
                      headers={"Authorization": f"Bearer {ACME}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        rows = r.json()["data"]  # none before acme's first request
        return rows[0]["batch"] if rows else dict.fromkeys(("requests", *TOKENS), 0)

    before = batch_usage()
    lines = [line(f"u{i}", chat(UNKNOWN if i == 2 else MODELS[i], i)) for i in range(5)]
    done = wait(c, start(c, lines).id)
    after = batch_usage()
    usages = [x["response"]["body"]["usage"] for x in read(c, done.output_file_id)]
    assert len(usages) == 4
    assert after["requests"] - before["requests"] == 4
    for name in TOKENS[:2]:
        assert after[name] - before[name] == sum(u[name] for u in usages) > 0, name
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    assert after["cached_tokens"] - before["cached_tokens"] == cached
    assert done.usage.output_tokens == sum(u["completion_tokens"] for u in usages)


def refusal(call, error=openai.BadRequestError) -> str:
    with pytest.raises(error) as caught:
        call()
    return caught.value.body["message"]


def test_an_upload_with_bad_lines_is_refused_naming_each_line(served):
    """Every malformed line of an upload is named by its number, the good ones are not."""
    good = line("a", chat(MODEL_ID, 0))
    bad = [
        "not json",
        "[1, 2]",
        json.dumps({k: v for k, v in good.items() if k != "custom_id"}),
        json.dumps(good),  # a custom_id already used
        json.dumps({**good, "custom_id": "b", "url": "/v1/embeddings"}),
        json.dumps(line("c", {"model": MODEL_ID, "max_tokens": 2})),  # no messages
        json.dumps(line("d", chat(MODEL_ID, 1, stream=True))),
        json.dumps({**good, "custom_id": "e", "method": "GET"}),
    ]
    content = "\n".join([json.dumps(good), *bad, json.dumps(line("z", chat(MODEL_ID, 2)))])
    c = client(served)
    message = refusal(lambda: c.files.create(file=("bad.jsonl", content.encode()),
                                             purpose="batch"))  # fmt: skip
    wanted = ["line 2: not JSON", "line 3: not a JSON object", "line 4: custom_id",
              "line 5: custom_id 'a' is used by an earlier line", "line 6: url",
              "line 7: body: messages", "line 8: body.stream", "line 9: method"]  # fmt: skip
    for part in wanted:
        assert part in message, (part, message)
    assert "line 1:" not in message and "line 10:" not in message


def test_empty_files_other_purposes_and_oversized_files_are_refused(served):
    """An empty file and a purpose other than batch get a 400; a file over
    batch.max_payload_mb gets a 413 naming the limit and its setting."""
    c = client(served)
    ok = jsonl([line("a", chat(MODEL_ID, 0))])
    message = refusal(lambda: c.files.create(file=("e.jsonl", b"\n \n"), purpose="batch"))
    assert "no requests" in message
    message = refusal(lambda: c.files.create(file=("f.jsonl", ok), purpose="fine-tune"))
    assert "fine-tune" in message
    big = jsonl(line(f"r{i}", chat(MODEL_ID, "x" * 1000)) for i in range(100))
    with pytest.raises(openai.APIStatusError) as caught:
        c.files.create(file=("big.jsonl", big), purpose="batch")
    assert caught.value.status_code == 413
    assert "0.0625 MiB" in caught.value.message and "batch.max_payload_mb" in caught.value.message


def test_batches_of_unknown_files_or_another_endpoints_lines_are_refused(served):
    """batches.create with an unknown file is a 404; with a file whose lines are for
    another endpoint than the batch's, a 400 naming both."""
    c = client(served)
    message = refusal(lambda: c.batches.create(input_file_id="file-000000000000000000000000",
                                                endpoint=CHAT, completion_window="24h"),
                      openai.NotFoundError)  # fmt: skip
    assert "file-000000000000000000000000" in message
    f = c.files.create(file=("t.jsonl", jsonl([line("a", {"model": MODEL_ID, "prompt": "x"},
                                                         TEXT)])), purpose="batch")  # fmt: skip
    message = refusal(lambda: c.batches.create(input_file_id=f.id, endpoint=CHAT,
                                               completion_window="24h"))  # fmt: skip
    assert TEXT in message and CHAT in message


def test_another_tenants_batches_and_files_read_as_unknown(served):
    """Through another tenant's key, a batch or file id answers exactly as an id that never
    existed: retrieve, cancel, content, delete and batches.create all 404 alike; the
    owner's batch is untouched."""
    c, them = client(served), client(served, GLOBEX)
    batch = start(c, [line("a", chat("upper", 0))])
    file_id, never_batch, never_file = batch.input_file_id, "batch_" + "0" * 24, "file-" + "0" * 24

    def unknown(call, some_id) -> str:
        return refusal(lambda: call(some_id), openai.NotFoundError).replace(some_id, "ID")

    for call in (them.batches.retrieve, them.batches.cancel):
        assert unknown(call, batch.id) == unknown(call, never_batch)
    create = partial(them.batches.create, endpoint=CHAT, completion_window="24h")
    for call in (them.files.retrieve, them.files.content, them.files.delete,
                 lambda file_id: create(input_file_id=file_id)):  # fmt: skip
        assert unknown(call, file_id) == unknown(call, never_file)
    done = wait(c, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 1
    theirs, never = done.output_file_id, never_file + "-output"
    assert unknown(them.files.content, theirs) == unknown(them.files.content, never)
    assert c.files.retrieve(file_id).id == file_id


def test_files_list_shows_the_tenants_own_uploads(served):
    """files.list: the key's tenant's uploads, newest first; another tenant's are not there."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    line = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": body})
    uploaded = client(served).files.create(file=("mine.jsonl", line.encode()), purpose="batch")
    assert client(served).files.list().data[0].id == uploaded.id
    assert uploaded.id not in {f.id for f in client(served, GLOBEX).files.list().data}
