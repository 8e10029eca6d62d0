"""Request bodies at the HTTP edge: pydantic models, turned into frozen engine requests at once.

Ranges follow OpenAI's (temperature 0..2, top_p in (0, 1], penalties -2..2) and Workers AI's
(repetition_penalty in (0, 2]); a field left out or sent as null takes the default given in
its description. OpenAI bodies ignore fields this server does not know (clients send many),
but refuse those known to change the answer that it does not serve (UNSERVED: logit_bias,
tools, ...); Workers-AI bodies refuse unknown fields, so a misspelt one is an error rather
than a silent default.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.api.messages import ChatMessage
from serving.api.response_format import OpenAIResponseFormat, WorkersResponseFormat
from serving.api.text import Text

MAX_STOPS = 16
MAX_PROMPTS = 64  # prompts of one completion request, each a generation of its own
MAX_TOP_LOGPROBS = 20
MAX_BATCH_ITEMS = 50_000  # requests in one batch; a larger job is split by its sender
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's (chat: no cap)


Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
WorkersTemperature = Annotated[float, Field(ge=0, le=5, allow_inf_nan=False)]
WorkersTopP = Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]
TopK = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]  # a torch generator's seed range
RepetitionPenalty = Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
MinP = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]
MAX_LOGIT_BIAS = 1024  # token ids one request may bias
MAX_STOP_TOKEN_IDS = 64
# >= 1, checked by a validator whose message the API contract fixes; the minimum documents it
MaxTokens = Annotated[int, Field(json_schema_extra={"minimum": 1})]


class _Sampling(BaseModel):
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

    @field_validator("max_tokens", check_fields=False)
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("max_tokens must be at least 1")
        return value


class _WorkersBody(_Sampling):
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

    external_reference: Annotated[Text, Field(max_length=256)] | None = Field(
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


class StreamOptions(BaseModel):
    include_usage: bool | None = False


# OpenAI fields that would change the answer and that this server does not serve: refused,
# not ignored (unknown fields are ignored, so these are named). field -> what leaves it off.
UNSERVED = {
    "tools": ([], "an empty list"),
    "tool_choice": ("none", '"none"'), "functions": ([], "an empty list"),
    "function_call": ("none", '"none"'), "suffix": ("", "an empty string"), "best_of": (1, "1"),
}  # fmt: skip


class _OpenAIBody(_Sampling):
    model_config = ConfigDict(extra="ignore")

    model: Text = Field(..., description="The model id, an adapter name or <model>:<adapter>.")
    n: int = Field(1, description="Choices to generate; only 1 is supported.")
    stop: Text | list[Text] | None = Field(None, description="Strings that end the output.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    response_format: OpenAIResponseFormat | None = Field(
        None, description="Output as text (default), any JSON object, or JSON fitting a schema."
    )
    logit_bias: dict[str, Bias] | None = Field(
        None, description="Token id (as a string) -> a bias from -100 to 100 added to its logit."
    )
    # vLLM's extra sampling fields
    min_p: MinP | None = Field(None, description="Drop tokens under min_p x the likeliest's p.")
    stop_token_ids: list[int] | None = Field(
        None, max_length=MAX_STOP_TOKEN_IDS, description="Token ids that end the output."
    )
    ignore_eos: bool = Field(False, description="Go on past the end-of-sequence token.")

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids may be biased")
        bad = next((k for k in value or {} if not (k.isascii() and k.isdigit())), None)
        if bad is not None:
            raise ValueError(f"{bad!r} is not a token id (a whole number >= 0, as a string)")
        return value

    def biases(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, zero biases left out."""
        return tuple((int(k), v) for k, v in (self.logit_bias or {}).items() if v != 0.0)

    @model_validator(mode="before")
    @classmethod
    def _unserved_fields_are_off(cls, data: object) -> object:
        for field, (off, spelt) in UNSERVED.items() if isinstance(data, dict) else ():
            value = data.get(field)
            if value is not None and not (value == off and type(value) is type(off)):
                raise ValueError(f"{field} is not supported (send {spelt}, or leave it out)")
        return data

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"only n=1 is supported, got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings are supported")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> _OpenAIBody:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_OpenAIBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: MaxTokens | None = Field(None, description="Same as max_tokens.")
    logprobs: bool = Field(False, description="Return each output token's log-probability.")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must not be empty")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _completion_at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("max_completion_tokens must be at least 1")
        return value

    @model_validator(mode="after")
    def _logprobs_need_flag(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_OpenAIBody):
    """POST /v1/completions: a raw prompt, as text or token ids."""

    prompt: Text | list[int] | list[Text] | list[list[int]] = Field(
        ..., description="Text or token ids, or a list of either (a choice each); no template."
    )
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="Return the top-n log-probabilities of each output token."
    )
    echo: bool = Field(False, description="Not supported: must be false.")

    @field_validator("prompt")
    @classmethod
    def _prompts_not_empty(cls, value: str | list) -> str | list:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and not isinstance(value[0], int):
            if len(value) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts in one request; send more "
                                 "through the batch API")  # fmt: skip
            empty = next((i for i, ids in enumerate(value) if ids == []), None)
            if empty is not None:
                raise ValueError(f"prompt {empty} is an empty list of token ids")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice: a lone text or token list is one prompt."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value

    def output_limit(self) -> int | None:
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return self.logprobs
