"""Workers-AI request bodies: a generation (a prompt or a chat), a queued batch of them, or a
poll. Workers AI's own ranges apply (temperature up to 5, top_p up to 2), and unknown fields
are refused, so a misspelt one is an error rather than a silent default."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.api.core.body_fields import (
    MAX_BATCH_ITEMS,
    SamplingFields,
    WorkersTemperature,
    WorkersTopP,
)
from serving.api.core.messages import ChatMessage
from serving.api.core.response_format import WorkersResponseFormat
from serving.api.core.text import Text, short_text
from serving.api.core.tools import MAX_TOOLS, FunctionDef, Tool


class _WorkersBody(SamplingFields):
    """A Workers-AI generation body: a prompt or a chat, optionally through an adapter."""

    model_config = ConfigDict(extra="forbid")

    # Workers AI's own ranges, wider than OpenAI's: a top_p over 1 cuts nothing
    temperature: WorkersTemperature | None = Field(None, description="0 is greedy; up to 5.")
    top_p: WorkersTopP | None = Field(None, description="Nucleus sampling mass; default 1 (off).")

    prompt: Text | None = Field(None, description="Text; the chat template wraps it unless raw.")
    messages: list[ChatMessage] | None = Field(None, description="A chat (instead of prompt).")
    raw: bool = Field(False, description="Send prompt as is, without the chat template.")
    stream: bool = Field(False, description="Answer with server-sent events.")
    response_format: WorkersResponseFormat | None = Field(
        None, description="JSON output: json_object, or json_schema with the schema itself."
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        max_length=MAX_TOOLS,
        description="Functions the model may call: "
        '{"name", "description", "parameters"}, or {"type": "function", "function": {...}}.',
    )  # kept as sent: a queued item is stored as its body and read again

    @field_validator("tools")
    @classmethod
    def _tools_read(cls, value: list[dict] | None) -> list[dict] | None:
        for k, tool in enumerate(value or ()):
            try:
                _tool(tool)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(p) for p in (k, *error["loc"]))
                raise ValueError(f"{where}: {str(error['msg']).removeprefix('Value error, ')}"
                                 ) from None  # fmt: skip
        return value

    def chat_tools(self) -> list[Tool] | None:
        """tools in the chat route's shape."""
        return None if self.tools is None else [_tool(t) for t in self.tools]

    def _other_form(self) -> bool:
        """Whether the body is a batch submission or poll rather than a generation."""
        return False

    @model_validator(mode="after")
    def _one_input(self) -> _WorkersBody:
        if self._other_form():
            return self
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        if self.raw and self.messages is not None:
            raise ValueError("raw applies to prompt only; messages always use the chat template")
        if self.tools and (self.raw or self.response_format is not None):
            raise ValueError("tools need the chat template and the output to themselves: "
                             "leave out raw and response_format")  # fmt: skip
        return self


class QueuedItem(_WorkersBody):
    """One request of a queued batch: a generation body and the caller's reference for it."""

    external_reference: short_text(256) | None = Field(
        None, description="Returned with this item's response."
    )

    @field_validator("stream")
    @classmethod
    def _not_streamed(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream is not supported for a queued request")
        return value


class WorkersAIRequest(_WorkersBody):
    """POST /ai/run/{model}: a generation; with ?queueRequest=true a batch of them
    (`requests`); or the poll of a queued batch (`request_id` alone)."""

    requests: list[QueuedItem] | None = Field(
        None, max_length=MAX_BATCH_ITEMS,
        description="With ?queueRequest=true: the requests of a batch to queue.",
    )  # fmt: skip
    request_id: Text | None = Field(None, description="Poll the queued batch of this id.")

    def _other_form(self) -> bool:
        return self.requests is not None or self.request_id is not None

    @model_validator(mode="after")
    def _one_form(self) -> WorkersAIRequest:
        given = [k for k in ("prompt", "messages", "requests") if getattr(self, k) is not None]
        asks = given or self.lora or self.stream or self.response_format
        if self.request_id is not None and asks:
            raise ValueError("request_id polls a queued batch: send it alone")
        if self.requests is not None:
            if len(given) > 1:
                raise ValueError("give either requests (a batch) or a prompt or messages")
            if not self.requests:
                raise ValueError("the batch has no requests")
            if self.stream:
                raise ValueError("stream is not supported for a queued batch")
            if self.response_format is not None:
                raise ValueError("response_format applies to one request: set it in each item")
        return self


def _tool(tool: dict) -> Tool:
    """A Workers-AI tool (its function's fields, or OpenAI's wrapper of them) as a Tool."""
    if "function" in tool or "type" in tool:
        return Tool.model_validate(tool)
    return Tool(type="function", function=FunctionDef.model_validate(tool))
