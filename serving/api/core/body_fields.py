"""The sampling fields every request body shares (SamplingFields), each wing's bodies built on
them (serving.api.openai.schemas, serving.api.workers_ai.schemas): pydantic models at the
HTTP edge, turned into frozen engine requests at once. Ranges follow OpenAI's (temperature 0..2, top_p in
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
    Field,
    ValidationInfo,
    model_validator,
)

from serving.api.core.text import Text

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
