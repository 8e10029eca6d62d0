"""OpenAI's Files and Batch API through the official `openai` client: a batch's output equals
each body sent alone, an unknown adapter fails its line only, listing pages, cancelling keeps
what finished and runs nothing more, and the batch's tokens are metered as batch usage."""

import time

import httpx
import openai
import pytest

from tests.serving.api.served import ACME, GLOBEX, MODEL_ID
from tests.serving.batch.openai_batch import (
    CHAT,
    GREEDY,
    MODELS,
    RESPONSES,
    TEXT,
    TOKENS,
    UNKNOWN,
    chat,
    client,
    jsonl,
    line,
    read,
    served_batches,
    slowed,
    start,
    until_completed,
    wait,
)  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with served_batches(world, tmp_path_factory.mktemp("openai-batch")) as s:
        yield s


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
    with pytest.raises(openai.NotFoundError) as alone:  # the line says what the request alone does
        c.chat.completions.create(**bodies["req-6"])
    assert error["response"]["body"]["error"] == alone.value.body
    output_file = c.files.retrieve(done.output_file_id)
    assert output_file.bytes == len(c.files.content(done.output_file_id).read())
    with pytest.raises(openai.BadRequestError, match=r"holds results of batch .* deleted with"):
        c.files.delete(done.output_file_id)  # kept with the batch, and still readable
    assert c.files.retrieve(done.output_file_id).bytes == output_file.bytes


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


def test_responses_batch_equals_each_body_alone(served):
    """The /v1/responses endpoint: each line's response object holds what the body gets
    alone, its usage in the Responses API's words."""
    c = client(served)
    bodies = [{"model": m, "input": f"count {i}", "instructions": "short", "temperature": 0,
               "max_output_tokens": 3} for i, m in enumerate(MODELS[:3])]  # fmt: skip
    lines = [line(f"r{i}", b, RESPONSES) for i, b in enumerate(bodies)]
    done = wait(c, start(c, lines, RESPONSES).id)
    assert done.endpoint == RESPONSES and done.error_file_id is None
    outputs = read(c, done.output_file_id)
    assert [x["custom_id"] for x in outputs] == ["r0", "r1", "r2"]
    lines_usage = []
    for out, body in zip(outputs, bodies, strict=True):
        got = out["response"]["body"]
        alone = c.responses.create(**body)
        assert got["object"] == "response" and got["status"] == alone.status
        assert got["output"][0]["content"][0]["text"] == alone.output_text
        assert got["usage"]["output_tokens"] == alone.usage.output_tokens
        lines_usage.append(got["usage"])
    # the batch object's usage adds up its lines' (read in the Responses API's words)
    assert done.usage.input_tokens == sum(u["input_tokens"] for u in lines_usage) > 0
    assert done.usage.output_tokens == sum(u["output_tokens"] for u in lines_usage) > 0


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
    in the output file, what never ran in the error file (batch_cancelled); at most the
    items already running finish after the cancel, and once cancelled the counts stop
    changing and the engine is idle."""
    c = client(served)
    with slowed(served):
        batch = start(c, [line(f"s{i}", chat(MODELS[i % 4], i, max_tokens=4)) for i in range(80)])
        until_completed(c, batch.id, 2)
        cancel = c.batches.cancel(batch.id)
        assert cancel.status in ("cancelling", "cancelled") and cancel.cancelling_at
        done = wait(c, batch.id)
    counts = done.request_counts
    assert done.status == "cancelled" and done.cancelled_at and done.completed_at is None
    ended = counts.completed + counts.failed
    assert cancel.request_counts.completed <= counts.completed and counts.failed == 0
    assert ended <= cancel.request_counts.completed + 8 < counts.total  # 8: max_in_flight
    outputs = read(c, done.output_file_id)
    assert len(outputs) == counts.completed
    assert {x["custom_id"] for x in outputs} <= {f"s{i}" for i in range(80)}
    # every request that never ran is an error line, so each custom_id is in one file
    never = read(c, done.error_file_id)
    assert {x["error"]["code"] for x in never} == {"batch_cancelled"}
    assert all(x["response"] is None for x in never)
    ids = [x["custom_id"] for x in outputs + never]
    assert sorted(ids) == sorted(f"s{i}" for i in range(80))
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
