"""The Responses API's answer shapes: the response object and its stream's events.

A stream is the events OpenAI sends for one text message, each with its type as the SSE
event name and a sequence_number: response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta
(one per piece of text), response.output_text.done, response.content_part.done,
response.output_item.done, then response.completed, or response.incomplete when
max_output_tokens stopped it. A request that fails mid-stream ends with error and
response.failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from serving.api.core.generation import failed
from serving.api.openai.responses_schemas import ResponsesRequest
from serving.engine.request import RequestOutput

# A failed response's error.code, from OpenAI's list: the caller's input, a limit, or ours.
ERROR_CODES = {400: "invalid_prompt", 429: "rate_limit_exceeded"}


@dataclass
class ResponseView:
    """One response being answered: its ids and the request fields it echoes."""

    rid: str  # resp_...
    msg_id: str  # msg_...: the one output message
    created_at: int
    body: ResponsesRequest
    sequence: int = field(default=0)

    def response(self, status: str, text: str | None = None, finish: str | None = None,
                 usage: dict | None = None, logprobs: list | None = None,
                 error: dict | None = None, calls: list[dict] | None = None) -> dict:  # fmt: skip
        """The response object; text None: no output yet (or, with calls, none but them);
        calls: the function_call items that follow the message."""
        b = self.body
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        output = [] if text is None else [self.message(text, finish, logprobs)]
        output += calls or []
        return {
            "id": self.rid, "object": "response", "created_at": self.created_at,
            "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": b.instructions, "max_output_tokens": b.output_limit(),
            "model": b.model, "output": output,
            "parallel_tool_calls": bool(b.tools) and b.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "store": False, "temperature": 1.0 if b.temperature is None else b.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                     else {"type": "text"}},
            "tool_choice": _tool_choice(b),
            "tools": [t.model_dump(exclude_none=True) for t in b.tools or ()],
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "truncation": b.truncation or "disabled", "usage": usage, "user": b.user,
            "metadata": b.metadata or {},
        }  # fmt: skip

    def message(self, text: str, finish: str | None, logprobs: list | None = None) -> dict:
        """The output message item; finish None: still being written."""
        status = "in_progress" if finish is None else final_status(finish)
        content = [self.part(text, logprobs)] if finish is not None else []
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": content}  # fmt: skip

    @staticmethod
    def part(text: str, logprobs: list | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    def event(self, kind: str, **payload) -> dict:
        """An SSE event (name and data) of the stream, numbered in order."""
        data = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return {"event": kind, "data": json.dumps(data)}

    def text_event(self, kind: str, **payload) -> dict:
        """An event about the message's one text part."""
        return self.event(kind, item_id=self.msg_id, output_index=0, content_index=0, **payload)


def failed_events(view: ResponseView, out: RequestOutput) -> list[dict]:
    """The events that end a stream whose request failed: error, then response.failed."""
    error = failed(out)
    code = ERROR_CODES.get(error.status, "server_error")
    problem = {"code": code, "message": error.message}
    return [view.event("error", code=code, message=error.message, param=None),
            view.event("response.failed", response=view.response("failed", error=problem))]  # fmt: skip


def function_call(name: str, arguments: str, call_id: str, status: str = "completed") -> dict:
    """A function_call output item, as OpenAI gives it (fc_ id; call_id is what the
    function_call_output item answering it names)."""
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"),
            "call_id": call_id, "name": name, "arguments": arguments, "status": status}  # fmt: skip


def _tool_choice(body: ResponsesRequest) -> str | dict:
    choice = body.tool_choice
    if choice is None:
        return "auto" if body.tools else "none"
    return choice if isinstance(choice, str) else choice.model_dump()


def response_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def final_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"
