"""Chat turns at the HTTP edge: OpenAI's message shapes, only text content served; an
assistant's tool calls and the tools' answers (role "tool") among them."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.errors import quoted
from serving.api.core.text import Text


class TextPart(BaseModel):
    """OpenAI's list form of message content: only text parts are served."""

    type: Literal["text"]
    text: Text


class CalledFunction(BaseModel):
    name: Text
    arguments: Text = Field(..., description="The arguments as JSON text (an object).")

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ValueError("function.arguments must be JSON text of an object") from None
        if not isinstance(parsed, dict):
            raise ValueError("function.arguments must be JSON text of an object")
        return value


class MessageToolCall(BaseModel):
    """A call an assistant turn made, as OpenAI's answer gave it."""

    model_config = ConfigDict(extra="ignore")

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """One turn of a chat; OpenAI's `developer` role is its newer name for `system`."""

    model_config = ConfigDict(extra="ignore")  # e.g. OpenAI's `refusal`

    role: Literal["system", "user", "assistant", "tool"]
    # null: an assistant turn that held only a refusal or tool calls, as OpenAI allows
    content: Text | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = Field(None, description="An assistant's calls.")
    tool_call_id: Text | None = Field(None, description="A tool turn: the call it answers.")
    name: Text | None = Field(None, description="A tool turn: the function that answered.")

    @model_validator(mode="before")
    @classmethod
    def _served_turn(cls, data: object) -> object:
        """One clear refusal for content this model cannot read, instead of a union's dump."""
        if not isinstance(data, dict):
            return data
        role = data.get("role")
        if isinstance(role, str) and role not in ("system", "developer", "user", "assistant",
                                                  "tool"):  # fmt: skip
            raise ValueError(f"role must be 'system', 'developer', 'user', 'assistant' or "
                             f"'tool', not {quoted(role)}")  # fmt: skip
        if role == "developer":
            data = {**data, "role": "system"}
        parts = data.get("content")
        for part in parts if isinstance(parts, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(f"only text content parts are supported, not {quoted(kind)}")
        if data.get("content") is None and data.get("role") in ("system", "user", "tool"):
            raise ValueError(f"a {data['role']} message needs content")
        if role == "tool" and not (data.get("tool_call_id") or data.get("name")):
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers "
                             "(or, as Workers AI has it, the function's name)")  # fmt: skip
        if data.get("tool_calls") is not None and role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        return data

    def turn(self) -> dict:
        """The turn as chat templates read it (transformers' shape: a call's arguments are
        an object, not its JSON text)."""
        turn: dict = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            turn["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                for c in self.tool_calls
            ]  # fmt: skip
        if self.tool_call_id is not None:
            turn["tool_call_id"] = self.tool_call_id
        if self.role == "tool" and self.name is not None:  # another turn's name is not read
            turn["name"] = self.name
        return turn

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)
