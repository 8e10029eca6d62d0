"""The OpenAI routes' bodies: /v1/chat/completions and /v1/completions (pydantic, at the
edge). Fields that would change the answer and are not served are refused by name; other
unknown fields are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.api.core.body_fields import MaxTokens, SamplingFields
from serving.api.core.messages import ChatMessage
from serving.api.core.response_format import OpenAIResponseFormat
from serving.api.core.text import Text
from serving.api.core.tools import ToolChoice, Tools, one_constraint

MAX_STOPS = 16
MAX_PROMPTS = 64  # prompts of one completion request, each a generation of its own
MAX_TOP_LOGPROBS = 20
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's (chat: no cap)
MinP = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]
MAX_LOGIT_BIAS = 1024  # token ids one request may bias
MAX_STOP_TOKEN_IDS = 64
MAX_CHOICES = 16  # n
MAX_GENERATIONS = 64  # prompts x n of one request, each a generation of its own


class StreamOptions(BaseModel):
    include_usage: bool | None = False


# OpenAI fields that would change the answer and that a route does not serve: refused, not
# ignored (unknown fields are ignored, so these are named). field -> (the value that leaves
# it off, that value spelt, what to use instead).
UNSERVED = {
    "functions": ([], "an empty list", "tools"),
    "function_call": ("none", '"none"', "tool_choice"),
    "suffix": ("", "an empty string", None), "best_of": (1, "1", None),
}  # fmt: skip
CHAT_ONLY = {  # served on /v1/chat/completions
    "tools": ([], "an empty list", "/v1/chat/completions"),
    "tool_choice": ("none", '"none"', "/v1/chat/completions"),
    "parallel_tool_calls": (True, "true", "/v1/chat/completions"),
}  # fmt: skip


class OpenAIBody(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    unserved: ClassVar[dict] = UNSERVED | CHAT_ONLY

    model: Text = Field(..., description="The model id, an adapter name or <model>:<adapter>.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices to generate for each prompt.")
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
        """logit_bias as (token id, bias) pairs, one per id ("5" and "05" name one token:
        their biases add up), zero biases left out."""
        summed: dict[int, float] = {}
        for key, bias in (self.logit_bias or {}).items():
            summed[int(key)] = summed.get(int(key), 0.0) + bias
        return tuple((i, b) for i, b in summed.items() if b != 0.0)

    @model_validator(mode="before")
    @classmethod
    def _unserved_fields_are_off(cls, data: object) -> object:
        for field, (off, spelt, instead) in cls.unserved.items() if isinstance(data, dict) else ():
            value = data.get(field)
            if value is not None and not (value == off and type(value) is type(off)):
                use = f"; use {instead}" if instead else ""
                raise ValueError(f"{field} is not supported here (send {spelt}, or leave it "
                                 f"out{use})")  # fmt: skip
        return data

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
    def _stream_options_need_a_stream(self) -> OpenAIBody:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    def num_choices(self) -> int:
        """The generations the body asks for: n for each prompt."""
        return self.n

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    # vLLM's prompt log-probabilities (serving/api/openai/echo.py answers them)
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="vLLM's: each prompt token's log-probability and the top-n (0..20)."
    )

    @model_validator(mode="after")
    def _prompt_logprobs_whole(self) -> OpenAIBody:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not served with stream: true (send stream: "
                             "false; on /v1/completions, echo streams the prompt's logprobs)")  # fmt: skip
        return self

    def num_prompt_logprobs(self) -> int | None:
        """The top-n the engine scores each prompt token with; None: it scores none."""
        return self.prompt_logprobs


class ChatCompletionRequest(OpenAIBody):
    """POST /v1/chat/completions."""

    unserved: ClassVar[dict] = UNSERVED
    messages: list[ChatMessage]
    tools: Tools | None = Field(None, description="Functions the model may call.")
    tool_choice: ToolChoice | None = Field(
        None,
        description='"none", "auto" (the default with tools), "required", or '
        '{"type": "function", "function": {"name": ...}}.',
    )
    parallel_tool_calls: bool | None = Field(None, description="More than one call (default).")

    @model_validator(mode="before")
    @classmethod
    def _no_echo(cls, data: object) -> object:
        # chat has no such field: it would be ignored, and the answer come without the prompt
        if isinstance(data, dict) and data.get("echo"):
            raise ValueError("echo is not served on /v1/chat/completions (send prompt_logprobs "
                             "for the prompt's log-probabilities, or use /v1/completions)")  # fmt: skip
        return data

    max_completion_tokens: MaxTokens | None = Field(None, description="Same as max_tokens.")
    logprobs: bool = Field(False, description="Return each output token's log-probability.")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("messages must not be empty")
        return value

    @model_validator(mode="after")
    def _logprobs_need_flag(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _one_constraint(self) -> ChatCompletionRequest:
        one_constraint(self.tools, self.tool_choice, self.response_format)
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(OpenAIBody):
    """POST /v1/completions: a raw prompt, as text or token ids."""

    prompt: Text | list[int] | list[Text] | list[list[int]] = Field(
        ..., description="Text or token ids, or a list of either (a choice each); no template."
    )
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description="Return the top-n log-probabilities of each output token."
    )
    echo: bool = Field(
        False, description="Return the prompt before the completion (its logprobs too)."
    )
    # 0 only with echo: the prompt alone, as lm-evaluation-harness scores a continuation
    max_tokens: Annotated[int, Field(ge=0)] | None = Field(
        None, description=f"Tokens to generate at most; default {DEFAULT_COMPLETION_TOKENS}."
    )

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

    @model_validator(mode="after")
    def _few_generations(self) -> CompletionRequest:
        count = len(self.prompts()) * self.n
        if count > MAX_GENERATIONS:
            raise ValueError(f"{len(self.prompts())} prompts x n={self.n} is {count} choices, "
                             f"more than the {MAX_GENERATIONS} one request may ask for")  # fmt: skip
        return self

    def num_choices(self) -> int:
        return len(self.prompts()) * self.n

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per choice: a lone text or token list is one prompt."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)

    @model_validator(mode="after")
    def _nothing_to_answer(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be at least 1 (0 is served with echo: true, "
                             "which answers the prompt alone)")  # fmt: skip
        return self

    def num_prompt_logprobs(self) -> int | None:
        """vLLM's rule: echo with logprobs scores the prompt with the logprobs' top-n."""
        asked = [self.prompt_logprobs, self.logprobs if self.echo else None]
        return max((n for n in asked if n is not None), default=None)

    def output_limit(self) -> int | None:
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return self.logprobs
