"""Helpers of the OpenAI Batch API tests: the client, input lines and files, and waiting."""

import json
import time
from contextlib import contextmanager

import openai
import pytest

from tests.serving.api.served import ACME, MODEL_ID, serve

GREEDY = {"temperature": 0, "max_tokens": 3}
MODELS = [MODEL_ID, "upper", "rot13", "mlp", f"{MODEL_ID}:rot13"]
UNKNOWN = "nobody-has-this"
CHAT, TEXT, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
TOKENS = ("prompt_tokens", "completion_tokens", "cached_tokens")


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
        if batch.status in ("completed", "cancelled", "expired"):
            return batch
        assert batch.status in ("in_progress", "cancelling"), batch.status
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not finish")


@contextmanager
def slowed(served, step_s=0.03):
    """Each forward of the served engine takes step_s longer, so a batch runs for seconds."""
    model = served.generator.engine.model
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(step_s)
        return forward(*args, **kwargs)

    model.forward = slow_forward
    try:
        yield
    finally:
        model.forward = forward


def until_completed(c, batch_id, n, timeout=60):
    """Wait until n of the batch's requests have completed."""
    deadline = time.monotonic() + timeout
    while c.batches.retrieve(batch_id).request_counts.completed < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests completed"
        time.sleep(0.02)


def read(c, file_id) -> list[dict]:
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()] if file_id else []


def refusal(call, error=openai.BadRequestError) -> str:
    """The message of the error call raises."""
    with pytest.raises(error) as caught:
        call()
    return caught.value.body["message"]


def served_batches(world, root):
    """The test server, with a 64 KiB batch payload limit."""
    return serve(world, root, max_batch_bytes=64 * 1024)
