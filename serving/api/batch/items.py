"""One queued item (an OpenAI batch line, a Workers-AI queued request) run through the app
itself, as the HTTP request it stands for.

An item is the body of a request to one of the app's own routes (/ai/run/{model},
/v1/chat/completions, /v1/completions, /v1/responses), so it is served by that route in this
process: the same validation, adapter resolution, generation and answer as if its tenant
had sent it, minus the network. The call's ASGI scope carries its principal (which the gate trusts: no
client can set scope state) and a QueuedCall (serving.api.core.queued_call), which runs
it at the scheduler's batch priority, unadmitted, its usage left for the feeder to meter.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI
from starlette.types import Message

from serving.api.core.caller import PRINCIPAL, Keys, Principal
from serving.api.core.queued_call import QUEUED_CALL, QueuedCall
from serving.batch.records import Item, ItemResult
from serving.usage.record import UsageRecord


def item_path(item: Item) -> str:
    """The route an item's body is for."""
    return f"/ai/run/{item.model}" if item.endpoint == "/ai/run" else item.endpoint


REVOKED = "the API key that submitted this batch is no longer valid"


def item_caller(ring: Keys, item: Item) -> Principal | None:
    """Who an item runs as: the submitting key's holder as the keys stand now (its scope
    included), None once that key is gone; on a keyless server, its one admin."""
    if ring.open:
        return Principal(item.tenant, "admin", item.key_id)
    holder = ring.holder(item.key_id)
    return holder if holder is not None and holder.tenant == item.tenant else None


async def run_item(app: FastAPI, item: Item) -> ItemResult:
    """item's answer from app's route for it: the JSON body and its status, and the usage.

    app is the FastAPI app: its state holds the key ring."""
    caller = item_caller(app.state.keys, item)
    if caller is None:  # a revoked key's queued items do not run on
        return ItemResult(401, error=REVOKED)
    body = json.dumps({**item.body, "stream": False}).encode()
    call = QueuedCall()
    path = item_path(item)
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": None, "server": None,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "state": {PRINCIPAL: caller, QUEUED_CALL: call},
    }  # fmt: skip
    sent = [False]
    status, chunks = [500], []

    async def receive() -> Message:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the item's "client" never leaves; cancelling ends it
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return answer_result(status[0], b"".join(chunks), call.record)


def answer_result(status: int, raw: bytes, record: UsageRecord | None) -> ItemResult:
    """An item's result from its route's answer (either API's JSON shape)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if status != 200 or not isinstance(answer, dict):
        # The error answer is kept whole: an OpenAI error line then carries its code
        # (model_not_found, context_length_exceeded), as the same request answered alone.
        kept = answer if isinstance(answer, dict) and status != 200 else None
        return ItemResult(status if status != 200 else 500, kept, _message(answer))
    if record is not None:  # what was metered: the same counts whatever the answer's shape
        counts = (record.prompt_tokens, record.completion_tokens, record.cached_tokens)
        return ItemResult(200, answer, None, *counts, usage=record)
    usage = answer.get("usage") or (answer.get("result") or {}).get("usage") or {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = usage.get("cached_tokens", details.get("cached_tokens", 0))
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return ItemResult(200, answer, None, prompt or 0, completion or 0, cached or 0, usage=record)


def _message(answer) -> str:
    """The message of an error answer in the Workers-AI or the OpenAI shape."""
    if isinstance(answer, dict):
        errors = answer.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("message", "error"))
        error = answer.get("error")
        if isinstance(error, dict):
            return str(error.get("message", "error"))
    return "the request failed with no readable answer"
