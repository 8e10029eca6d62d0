"""`response_format`: JSON mode and JSON-schema constrained output, checked at the HTTP edge.

The engine turns a schema into a grammar (xgrammar) and masks every token the grammar does
not allow. A keyword the grammar compiler drops silently would let through output that does
not validate, so a schema is refused here, with a 400 naming the problem and where it is,
unless every keyword in it is one the compiler was seen to enforce (serving.api.core.schema_rules).

Shapes
  OpenAI routes: {"type": "text"} (free text, as if absent), {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {"name", "description"?, "schema", "strict"?}}.
  Workers AI (/ai/run and its queued items): {"type": "json_object"} or
    {"type": "json_schema", "json_schema": <the schema itself>}. A `json_schema` whose
    "schema" member is an object is read as OpenAI's wrapper instead, so a client may send
    either shape; "schema" is no JSON-schema keyword, so no schema served here reads as one.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from serving.api.core.schema_rules import canonical, check_schema
from serving.api.core.text import Text
from serving.engine.request import ResponseFormat

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name

Kind = Literal["text", "json_object", "json_schema"]
JSON_OBJECT = ResponseFormat("json_object")


class JsonSchema(BaseModel):
    """OpenAI's json_schema: a named schema the output must validate against."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="1-64 characters of a-z, A-Z, 0-9, _ and -.")
    description: Text | None = Field(None, description="Accepted; the model is not shown it.")
    # strict before the schema: its check reads strict (info.data), which changes the cost
    strict: bool | None = Field(None, description="Refuse properties the schema does not name.")
    schema_: Any = Field(..., alias="schema", description="The JSON schema (an object).",
                         json_schema_extra={"type": "object"})  # fmt: skip

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError("name must be 1-64 characters of a-z, A-Z, 0-9, _ and -")
        return value

    @field_validator("schema_")
    @classmethod
    def _enforced(cls, value: object, info: ValidationInfo) -> dict:
        return check_schema(value, bool(info.data.get("strict")))


class _Format(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Kind = Field(..., description='"text" (free), "json_object" or "json_schema".')

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> _Format:
        given = getattr(self, "json_schema", None) is not None
        if self.type == "json_schema" and not given:
            raise ValueError('needs json_schema with "type": "json_schema"')
        if self.type != "json_schema" and given:
            raise ValueError(f'json_schema goes with "type": "json_schema", not {self.type!r}')
        return self

    def _schema(self) -> tuple[dict, bool]:
        """(the schema, strict): each shape of json_schema keeps them in its own place."""
        raise NotImplementedError  # each subclass defines it

    def engine_format(self) -> ResponseFormat | None:
        """What the engine constrains the output to; None: free text."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return JSON_OBJECT
        schema, strict = self._schema()
        return ResponseFormat("json_schema", canonical(schema), strict)


class OpenAIResponseFormat(_Format):
    """OpenAI's response_format: free text, any JSON object, or JSON that fits a schema."""

    json_schema: JsonSchema | None = Field(None, description='With "type": "json_schema".')

    def _schema(self) -> tuple[dict, bool]:
        return self.json_schema.schema_, bool(self.json_schema.strict)


class WorkersResponseFormat(_Format):
    """Workers AI's response_format: json_schema is the schema, or OpenAI's wrapper of it."""

    json_schema: Any = Field(None, description='With "type": "json_schema": the JSON schema.',
                             json_schema_extra={"type": "object"})  # fmt: skip

    @field_validator("json_schema")
    @classmethod
    def _enforced(cls, value: object) -> object:
        if value is not None:
            _unwrap(value)
        return value  # kept as sent: a queued item is stored as its body and read again

    def _schema(self) -> tuple[dict, bool]:
        return _unwrap(self.json_schema)


def engine_format(field: _Format | None) -> ResponseFormat | None:
    """The engine's ResponseFormat of a body's response_format field, None when absent."""
    return field.engine_format() if field is not None else None


def _unwrap(value: object) -> tuple[dict, bool]:
    """The schema and strict flag of a Workers-AI json_schema (bare, or OpenAI's wrapper)."""
    if not (isinstance(value, dict) and isinstance(value.get("schema"), dict)):
        return check_schema(value), False
    try:
        spec = JsonSchema.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ValueError(message if message.startswith(("the schema", f"{where} ")) else
                         f"{where}: {message}") from None  # fmt: skip
    return spec.schema_, bool(spec.strict)
