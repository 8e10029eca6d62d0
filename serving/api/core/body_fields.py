"""Request bodies at the HTTP edge: pydantic models, turned into frozen engine requests at once.

Here: the sampling fields every body shares (SamplingFields) and the Workers-AI bodies; the
OpenAI bodies are in openai_schemas. Ranges follow OpenAI's (temperature 0..2, top_p in
(0, 1], penalties -2..2) and Workers AI's (repetition_penalty in (0, 2]; on /ai/run
temperature up to 5 and top_p up to 2); a field left out or sent as null takes the default
given in its description. Workers-AI bodies refuse unknown fields, so a misspelt one is an
error rather than a silent default.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from serving.api.core.messages import ChatMessage
from serving.api.core.response_format import WorkersResponseFormat
from serving.api.core.text import Text, short_text

MAX_BATCH_ITEMS = 50_000  # requests in one batch; a larger job is split by its sender


Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
WorkersTemperature = Annotated[float, Field(ge=0, le=5, allow_inf_nan=False)]
WorkersTopP = Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]
TopK = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # a 64-bit integer, as vLLM takes
RepetitionPenalty = Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


def _at_least_one(value: int, info: ValidationInfo) -> int:
    # the API contract fixes this message ("max_tokens must be at least 1"), not pydantic's
    if value < 1:
        raise ValueError(f"{info.field_name} must be at least 1")
    return value


# A token count (max_tokens and its aliases); the minimum documents the check in the schema
MaxTokens = Annotated[int, AfterValidator(_at_least_one), Field(json_schema_extra={"minimum": 1})]


class SamplingFields(BaseModel):
    """Fields every generation body shares."""

    max_tokens: MaxTokens | None = Field(None, description="Tokens to generate at most.")
    temperature: Temperature | None = Field(None, description="0 is greedy.")
    top_p: TopP | None = Field(None, description="Nucleus sampling mass; default 1 (off).")
    top_k: TopK | None = Field(None, description="Sample among the k likeliest; 0 (default) off.")
    seed: Seed | None = Field(None, description="Makes sampling repeatable.")
    repetition_penalty: RepetitionPenalty | None = Field(None, description="Default 1 (off).")
    frequency_penalty: Penalty | None = Field(None, description="Default 0 (off).")
    presence_penalty: Penalty | None = Field(None, description="Default 0 (off).")
    lora: Text | None = Field(None, description="Adapter: name, name@digest or <model>:name.")

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: object) -> object:
        """A field sent as null takes its default (`"n": null`, `"stream": null`), as OpenAI's
        API takes it; clients built from typed models send every unset field so."""
        if isinstance(data, dict):  # unknown fields stay, for a Workers-AI body to refuse
            fields = cls.model_fields
            return {k: v for k, v in data.items() if v is not None or k not in fields}
        return data


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
