"""Tool calling at the HTTP edge: OpenAI's `tools` and `tool_choice`, checked, and the plan
they make for one request: the model's family of call syntax, and the constraint on its output.

With tool_choice "required" or a named function the output is calls only, and each call's
arguments validate against its function's `parameters`; with "auto" the text is free until
the model opens a call, and from there the call is held to the same rule (an xgrammar
structural tag, serving/model/tool_formats.py). "none" leaves the output free and unread.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serving.api.core.errors import ApiError
from serving.api.core.response_format import NAME
from serving.api.core.schema_rules import check_schema
from serving.api.core.settings import AppSettings
from serving.api.core.text import Text
from serving.engine.request import ResponseFormat
from serving.model.tool_formats import CONFIG_KEY, FORMATS, ToolFormat, detect, structural_tag
from serving.model.tool_parse import ToolCall, parse_calls

MAX_TOOLS = 128  # functions one request may offer (OpenAI's limit)
EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function that takes no arguments


class FunctionDef(BaseModel):
    """A function the model may call: its name, what it does, and its arguments' schema."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(..., description="1-64 characters of a-z, A-Z, 0-9, _ and -.")
    description: Text | None = None
    parameters: Any = Field(None, description="A JSON schema of the arguments (an object).",
                            json_schema_extra={"type": "object"})  # fmt: skip
    strict: bool | None = Field(None, description="Refuse arguments the schema does not name.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError("a function's name must be 1-64 characters of a-z, A-Z, 0-9, _ and -")
        return value

    @field_validator("parameters")
    @classmethod
    def _enforced(cls, value: object, info) -> dict | None:
        if value is None:
            return None
        return check_schema(value, bool(info.data.get("strict")))

    def schema(self) -> dict:
        return EMPTY_PARAMETERS if self.parameters is None else self.parameters


class Tool(BaseModel):
    """OpenAI's chat tool: {"type": "function", "function": {...}}."""

    type: Literal["function"] = Field(..., description='Only "function" tools are served.')
    function: FunctionDef


class _Named(BaseModel):
    name: str


class NamedChoice(BaseModel):
    """tool_choice naming one function: that call, and nothing else, is the answer."""

    type: Literal["function"]
    function: _Named


ToolChoice = Literal["none", "auto", "required"] | NamedChoice
Tools = Annotated[list[Tool], Field(max_length=MAX_TOOLS)]


@dataclass(frozen=True)
class ToolPlan:
    """One request's tools as the route acts on them."""

    format: ToolFormat  # how the model writes a call
    constraint: ResponseFormat  # what the engine holds the output to

    def read(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a whole answer."""
        return parse_calls(self.format, text)

    def call_id(self) -> str:
        """A new call's id: OpenAI's spelling, or the one the model's template insists on."""
        return call_id(self.format.id_length)


def one_constraint(
    tools: list | None, choice: object, response_format, field: str = "response_format"
) -> None:
    """ValueError when both tools (called) and a response format (the body's `field`) would
    shape one answer."""
    shaped = response_format is not None and response_format.type != "text"
    if tools and choice != "none" and shaped:
        raise ValueError(f"{field} and tools cannot constrain one answer together: leave "
                         f'{field} out, or send tool_choice "none"')  # fmt: skip


def choice_name(choice: ToolChoice | None, tools: list[Tool] | None) -> str:
    """ "none", "auto", "required" or the named function; a 400 names a choice that cannot be."""
    if choice is None or (choice == "auto" and not tools):  # auto with nothing to call: none
        return "auto" if tools else "none"
    if isinstance(choice, NamedChoice):
        name = choice.function.name
        if not any(t.function.name == name for t in tools or ()):
            raise ApiError(400, f"tool_choice names the function {name!r}, which tools does "
                                "not define", param="tool_choice")  # fmt: skip
        return name
    if choice == "required" and not tools:
        raise ApiError(400, 'tool_choice "required" needs tools: define at least one function',
                       param="tool_choice")  # fmt: skip
    return choice


def tool_plan(
    settings: AppSettings,
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
) -> ToolPlan | None:
    """The plan for a request's tools; None when its output is free text (no tools, or
    tool_choice "none"); a 400 naming what to change when the model cannot call them."""
    name = choice_name(choice, tools)
    if name == "none":
        return None
    names = [t.function.name for t in tools]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ApiError(400, f"tools defines the function {twice!r} twice", param="tools")
    fmt = model_tool_format(settings)
    functions = [(t.function.name, t.function.schema(), bool(t.function.strict)) for t in tools]
    tag = structural_tag(fmt, functions, name, parallel is not False)
    return ToolPlan(fmt, ResponseFormat("structural_tag", json.dumps(tag)))


def model_tool_format(settings: AppSettings) -> ToolFormat:
    """The served model's family of call syntax: set in the config, or its template's."""
    if settings.tool_call_format != "auto":
        return FORMATS[settings.tool_call_format]
    fmt = detect(settings.tokenizer.chat_template)
    if fmt is None:
        raise ApiError(
            400,
            "tools: this model's chat template names no tool-call format, so its calls "
            f"cannot be read; set {CONFIG_KEY} ({' or '.join(FORMATS)}) in the server's "
            "config, or leave tools out",
            param="tools",
        )
    return fmt


def call_id(length: int | None = None) -> str:
    """A new tool call's id: as OpenAI spells them, or `length` letters and digits."""
    if length is not None:
        return secrets.token_hex(length)[:length]
    return f"call_{secrets.token_hex(12)}"


def template_tools(tools: list[Tool] | None) -> list[dict] | None:
    """tools as chat templates read them (transformers' shape: OpenAI's)."""
    if not tools:
        return None
    return [{"type": "function", "function": {
        "name": t.function.name,
        **({"description": t.function.description} if t.function.description else {}),
        "parameters": t.function.schema()}} for t in tools]  # fmt: skip
