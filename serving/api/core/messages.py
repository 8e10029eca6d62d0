"""Chat turns at the HTTP edge: OpenAI's message shapes, only text content served."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from adapters.errors import quoted
from serving.api.core.text import Text


class TextPart(BaseModel):
    """OpenAI's list form of message content: only text parts are served."""

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """One turn of a chat; OpenAI's `developer` role is its newer name for `system`."""

    model_config = ConfigDict(extra="ignore")  # e.g. OpenAI's optional `name`

    role: Literal["system", "user", "assistant"]
    # null: an assistant turn that held only a refusal or tool calls, as OpenAI allows
    content: Text | list[TextPart] | None = None

    @model_validator(mode="before")
    @classmethod
    def _served_turn(cls, data: object) -> object:
        """One clear refusal for content this model cannot read, instead of a union's dump."""
        if not isinstance(data, dict):
            return data
        role = data.get("role")
        if isinstance(role, str) and role not in ("system", "developer", "user", "assistant"):
            raise ValueError(
                f"role must be 'system', 'developer', 'user' or 'assistant', not {quoted(role)}"
            )
        if role == "developer":
            data = {**data, "role": "system"}
        parts = data.get("content")
        for part in parts if isinstance(parts, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(f"only text content parts are supported, not {quoted(kind)}")
        if data.get("content") is None and data.get("role") in ("system", "user"):
            raise ValueError(f"a {data['role']} message needs content")
        return data

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)
