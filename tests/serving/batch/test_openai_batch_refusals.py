"""OpenAI's Files and Batch API refusing what it cannot run: bad lines named one by one, empty
or oversized files, unknown files and endpoints, and another tenant's ids read as unknown."""

import json
from functools import partial

import httpx
import openai
import pytest

from tests.serving.api.served import ACME, GLOBEX, MODEL_ID
from tests.serving.batch.openai_batch import (
    CHAT,
    TEXT,
    chat,
    client,
    jsonl,
    line,
    refusal,
    served_batches,
    start,
    wait,
)  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with served_batches(world, tmp_path_factory.mktemp("openai-batch")) as s:
        yield s


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
    # Polled through the Workers-AI route, whose answers cannot carry its OpenAI lines:
    polled = httpx.post(f"{served.url}/ai/run/{MODEL_ID}", json={"request_id": batch.id},
                        headers={"Authorization": f"Bearer {ACME}"}, timeout=30)  # fmt: skip
    assert polled.status_code == 400 and "is an OpenAI batch" in polled.text


def test_files_list_shows_the_tenants_own_uploads(served):
    """files.list: the key's tenant's uploads, newest first; another tenant's are not there."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    line = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": body})
    uploaded = client(served).files.create(file=("mine.jsonl", line.encode()), purpose="batch")
    assert client(served).files.list().data[0].id == uploaded.id
    assert client(served).files.list(purpose="batch").data[0].id == uploaded.id
    assert client(served).files.list(purpose="fine-tune").data == []  # filtered by purpose
    assert uploaded.id not in {f.id for f in client(served, GLOBEX).files.list().data}


def test_files_list_pages_by_limit_after_and_order_and_says_when_files_expire(served):
    """OpenAI's files.list paging: limit, after (a file id) and order; has_more, first_id and
    last_id; the client's auto-paging walks every page. Each file expires batch.ttl_hours
    (72 by default) after it was made."""
    c = client(served, GLOBEX)
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    line = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": body}).encode()
    made = [c.files.create(file=(f"p{i}.jsonl", line), purpose="batch").id for i in range(5)]
    newest = [f.id for f in c.files.list().data if f.id in made]
    assert sorted(newest) == sorted(made) and len(newest) == 5
    page = c.files.list(limit=2)
    assert [f.id for f in page.data] == newest[:2] and page.has_more
    rest = c.files.list(limit=2, after=page.data[-1].id)
    assert [f.id for f in rest.data] == newest[2:4]
    assert [f.id for f in c.files.list(limit=2)] == [f.id for f in c.files.list().data]  # walks
    oldest = [f.id for f in c.files.list(order="asc").data if f.id in made]
    assert oldest == newest[::-1]
    last = c.files.list(limit=10, after=newest[3])
    assert [f.id for f in last.data] == newest[4:] and not last.has_more
    assert all(f.expires_at == f.created_at + 72 * 3600 for f in c.files.list().data)
    assert c.files.retrieve(made[0]).expires_at == c.files.retrieve(made[0]).created_at + 72 * 3600
