"""The body of POST /v1/responses (OpenAI's Responses API), read into a chat.

A response is stateless here: `input` (a text, or a list of turns, earlier responses'
output messages among them) and `instructions` make one chat, answered by one assistant
message. Nothing is stored, so `previous_response_id` and `background` are refused, and the
answer says `"store": false`. Text in and text out, and function tools: `tools` (Responses'
flat shape), `tool_choice`, and `function_call` and `function_call_output` items in the
input, read as the chat route's tool calls and tool turns. Images, files and the hosted
tools are refused by name.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from adapters.errors import quoted
from serving.api.core.body_fields import MaxTokens
from serving.api.core.messages import CalledFunction, ChatMessage, MessageToolCall
from serving.api.core.response_format import JsonSchema, OpenAIResponseFormat
from serving.api.core.text import Metadata, Text
from serving.api.core.tools import (
    MAX_TOOLS,
    FunctionDef,
    NamedChoice,
    Tool,
    ToolChoice,
    one_constraint,
)
from serving.api.openai.schemas import MAX_TOP_LOGPROBS, UNSERVED, OpenAIBody

TEXT_PARTS = ("input_text", "output_text", "text")
# What an item of `input` may hold that this server cannot read: refused by name.
UNREAD_PARTS = ("input_image", "input_file", "input_audio", "refusal")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class TextFormat(BaseModel):
    """text.format: free text, any JSON object, or JSON fitting a schema (flattened: the
    schema's name, schema and strict sit beside "type")."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: Text | None = None
    schema_: Any = Field(None, alias="schema", json_schema_extra={"type": "object"})
    strict: bool | None = None

    _built: OpenAIResponseFormat | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _as_response_format(self) -> TextFormat:
        """Checked as response_format is (the schema's rules), so errors point in here."""
        if self.type != "json_schema":
            self._built = OpenAIResponseFormat(type=self.type)
            return self
        if self.name is None or self.schema_ is None:
            raise ValueError('"type": "json_schema" needs a name and a schema')
        spec = {"name": self.name, "schema": self.schema_, "strict": self.strict,
                "description": self.description}  # fmt: skip
        self._built = OpenAIResponseFormat(type="json_schema", json_schema=JsonSchema(**spec))
        return self

    def response_format(self) -> OpenAIResponseFormat:
        return self._built


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. verbosity, which a small model has not

    format: TextFormat | None = None


class FunctionTool(FunctionDef):
    """Responses' function tool: the function's fields beside "type"."""

    type: Literal["function"] = Field(..., description='Only "function" tools are served.')


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class ResponsesRequest(OpenAIBody):
    """POST /v1/responses."""

    unserved: ClassVar[dict] = UNSERVED
    input: Text | list[dict[str, Any]] = Field(..., description="A text, or a list of turns.")
    tools: list[FunctionTool] | None = Field(
        None, max_length=MAX_TOOLS, description="Functions the model may call."
    )
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = Field(
        None,
        description='"none", "auto" (the default with tools), "required", or '
        '{"type": "function", "name": ...}.',
    )
    instructions: Text | None = Field(None, description="A system turn put before the input.")
    max_output_tokens: MaxTokens | None = Field(None, description="Tokens to generate at most.")
    text: TextConfig | None = Field(None, description='{"format": ...}: text or JSON output.')
    store: bool | None = Field(None, description="Accepted; responses are never stored here.")
    metadata: Metadata | None = Field(None, description="Up to 16 pairs, echoed back.")
    include: list[str] | None = Field(None, description=f"Only {LOGPROBS_INCLUDE!r} is served.")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    truncation: Literal["disabled", "auto"] | None = Field(
        None, description='"auto" drops the oldest turns of an input over the context.'
    )
    # Accepted and left alone: a reasoning effort, a service tier, a cache key
    reasoning: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _served_shape(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        refused = {
            "previous_response_id": "responses are not stored here: send the whole "
            "conversation as input",
            "conversation": "responses are not stored here: send the whole conversation as input",
            "background": "background responses are not supported",
            "response_format": "use text.format on /v1/responses",
            "prompt": "stored prompts are not supported",
            "echo": "not served on /v1/responses: use /v1/completions",
        }
        for field, why in refused.items():
            if data.get(field) not in (None, False):
                raise ValueError(f"{field}: {why}")
        if data.get("prompt_logprobs") is not None:  # 0 asks too: the tokens' own logprobs
            raise ValueError("prompt_logprobs: not served on /v1/responses: use "
                             "/v1/chat/completions")  # fmt: skip
        if data.get("n") not in (None, 1):
            raise ValueError("n: a response has one output; send n requests for more")
        for k, tool in enumerate(data.get("tools") or ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ValueError(f"tools[{k}]: only function tools are served, not "
                                 f"{quoted(str(kind))}")  # fmt: skip
        return data

    def chat_tools(self) -> list[Tool] | None:
        """tools in the chat route's shape."""
        if self.tools is None:
            return None
        return [Tool(type="function", function=FunctionDef.model_validate(
            t.model_dump(exclude={"type"}))) for t in self.tools]  # fmt: skip

    def chat_tool_choice(self) -> ToolChoice | None:
        """tool_choice in the chat route's shape."""
        choice = self.tool_choice
        if isinstance(choice, NamedFunction):
            return NamedChoice(type="function", function={"name": choice.name})
        return choice

    @field_validator("include")
    @classmethod
    def _served_include(cls, value: list[str] | None) -> list[str] | None:
        bad = next((v for v in value or () if v != LOGPROBS_INCLUDE), None)
        if bad is not None:
            raise ValueError(f"include: {quoted(bad)} is not supported (only {LOGPROBS_INCLUDE})")
        return value

    @model_validator(mode="after")
    def _format_is_valid(self) -> ResponsesRequest:
        if self.text is not None and self.text.format is not None:
            self.response_format = self.text.format.response_format()
        one_constraint(self.tools, self.tool_choice, self.response_format, "text.format")
        self.messages()  # a turn this server cannot read is the caller's 400, here
        return self

    def messages(self) -> list[ChatMessage]:
        """The chat: instructions as a system turn, then the input's turns."""
        turns = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*turns, ChatMessage(role="user", content=self.input)]
        for k, item in enumerate(self.input):
            turn = _turn(k, item)
            last = turns[-1] if turns else None
            if turn.tool_calls and last is not None and last.role == "assistant":
                # calls after an assistant's text, or after its other calls: one turn
                last.tool_calls = [*(last.tool_calls or []), *turn.tool_calls]
                continue
            turns.append(turn)
        if not turns:
            raise ValueError("input: needs at least one turn")
        return turns

    def output_limit(self) -> int | None:
        return self.max_output_tokens if self.max_output_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        """Logprobs of the output tokens, with top_logprobs alternatives, when included."""
        if LOGPROBS_INCLUDE not in (self.include or ()):
            return None
        return self.top_logprobs or 0


def _turn(k: int, item: object) -> ChatMessage:
    """input[k] as a chat turn: a message (easy or full form) of text parts."""
    where = f"input[{k}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a message object")
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        return _tool_turn(where, kind, item)
    if kind != "message":
        raise ValueError(f"{where}: items of type {quoted(str(kind))} are not supported "
                         "(messages, function_call and function_call_output are)")  # fmt: skip
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise ValueError(f"{where}.role: expected user, assistant, system or developer")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            part_kind = part.get("type") if isinstance(part, dict) else None
            if part_kind in UNREAD_PARTS:
                raise ValueError(f"{where}.content[{j}]: only text is supported, not "
                                 f"{quoted(part_kind)}")  # fmt: skip
            if part_kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
                raise ValueError(f"{where}.content[{j}]: expected a text part "
                                 '({"type": "input_text", "text": ...})')  # fmt: skip
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise ValueError(f"{where}.content: expected a text or a list of text parts")
    try:
        return ChatMessage(role=role, content=content)
    except ValidationError as exc:  # e.g. a lone surrogate in the text
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where}.content: {message}") from None


def _tool_turn(where: str, kind: str, item: dict) -> ChatMessage:
    """A function_call item as an assistant's call, a function_call_output as a tool turn."""
    try:
        if kind == "function_call":
            call = MessageToolCall(id=item.get("call_id"), function=CalledFunction(
                name=item.get("name"), arguments=item.get("arguments")))  # fmt: skip
            return ChatMessage(role="assistant", content=None, tool_calls=[call])
        output = item.get("output")
        if isinstance(output, list):  # text parts
            output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
        return ChatMessage(role="tool", content=output, tool_call_id=item.get("call_id"))
    except ValidationError as exc:
        error = exc.errors()[0]
        at = ".".join(str(p) for p in error["loc"] if p != "function")
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where}{'.' + at if at else ''}: {message}") from None
