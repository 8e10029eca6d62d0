"""A streamed response whose request offered tools: its output items as they come.

The text is read as it arrives (serving.api.core.tool_deltas.py) into message text and
function calls, and each becomes the output items and events OpenAI streams for it: a
message's output_item.added, content_part.added, output_text.delta, ... output_item.done;
a call's output_item.added (its name, arguments ""), response.function_call_arguments.delta
per piece, response.function_call_arguments.done and output_item.done. Items are numbered
in the order they open; the response ends as the plain stream's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from serving.api.core.choices import merged
from serving.api.core.generation import Generation, new_id
from serving.api.core.tool_deltas import ToolDeltas
from serving.api.core.tools import ToolPlan
from serving.api.openai.responses_format import (
    ResponseView,
    failed_events,
    final_status,
    function_call,
    response_usage,
)


class _Items:
    """The response's output items so far, and the one still open."""

    def __init__(self, view: ResponseView) -> None:
        self.view, self.done = view, []
        self.open: dict | None = None  # the item being written: a message or a call

    def _event(self, kind: str, **payload) -> dict:
        return self.view.event(kind, output_index=len(self.done), **payload)

    def text(self, piece: str) -> list[dict]:
        events = [] if self.open is None or self.open["type"] == "message" else self.close()
        if self.open is None:
            msg_id = new_id("msg").replace("-", "_")
            self.open = {"type": "message", "id": msg_id, "status": "in_progress",
                         "role": "assistant", "content": [], "text": ""}  # fmt: skip
            events.append(self._event("response.output_item.added", item=self._shown()))
            events.append(self._part_event("response.content_part.added", part=self.view.part("")))
        self.open["text"] += piece
        events.append(self._part_event("response.output_text.delta", delta=piece, logprobs=[]))
        return events

    def call(self, name: str, call_id: str) -> list[dict]:
        events = self.close()
        self.open = function_call(name, "", call_id, "in_progress")
        events.append(self._event("response.output_item.added", item=dict(self.open)))
        return events

    def arguments(self, piece: str) -> list[dict]:
        self.open["arguments"] += piece
        return [self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                            delta=piece)]  # fmt: skip

    def close(self, finish: str = "stop") -> list[dict]:
        """Events that end the open item, if any."""
        item, self.open = self.open, None
        if item is None:
            return []
        if item["type"] == "message":
            text = item.pop("text")
            item.update(status=final_status(finish), content=[self.view.part(text)])
            events = [
                self._part_event("response.output_text.done", text=text, logprobs=[],
                                 item_id=item["id"]),
                self._part_event("response.content_part.done", part=self.view.part(text),
                                 item_id=item["id"]),
            ]  # fmt: skip
        else:
            item["status"] = "completed" if finish == "stop" else "incomplete"
            events = [self._event("response.function_call_arguments.done", item_id=item["id"],
                                  arguments=item["arguments"])]  # fmt: skip
        events.append(self._event("response.output_item.done", item=item))
        self.done.append(item)
        return events

    def _shown(self) -> dict:
        return {k: v for k, v in self.open.items() if k != "text"}

    def _part_event(self, kind: str, item_id: str | None = None, **payload) -> dict:
        return self._event(kind, item_id=item_id or self.open["id"], content_index=0, **payload)


async def tool_events(gen: Generation, view: ResponseView, plan: ToolPlan) -> AsyncIterator[dict]:
    """The stream of a response whose output may hold function calls."""
    yield view.event("response.created", response=view.response("in_progress"))
    yield view.event("response.in_progress", response=view.response("in_progress"))
    items, reader, last = _Items(view), ToolDeltas(plan), None
    async with contextlib.aclosing(merged([gen])) as outputs:  # closed when the stream is
        async for _, out in outputs:
            if out.finish_reason == "error":
                for event in failed_events(view, out):
                    yield event
                return
            deltas = reader.deltas(out.new_text) + (reader.end() if out.finished else [])
            for delta in deltas:
                for event in _delta_events(items, delta):
                    yield event
            if out.finished:
                last = out
    if last is None:  # the stream was closed first
        return
    for event in items.close(last.finish_reason or "stop"):
        yield event
    usage = response_usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
    status = final_status(last.finish_reason)
    final = view.response(status, None, last.finish_reason, usage, calls=items.done)
    yield view.event(f"response.{status}", response=final)


def _delta_events(items: _Items, delta: dict) -> list[dict]:
    if "content" in delta:
        return items.text(delta["content"]) if delta["content"] else []
    call = delta["tool_calls"][0]
    if "id" in call:
        return items.call(call["function"]["name"], call["id"])
    return items.arguments(call["function"]["arguments"])
