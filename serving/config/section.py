"""What every config section shares: its base class, the config error, the id rule, limits.

Unknown keys are errors at every level, so a typo never silently falls back to a default.
Paths and URLs resolve once, at load time (serving/config/locations.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MODEL_ID_RULE = "use 1-64 of A-Z, a-z, 0-9, '.', '_', '-', starting with a letter or digit (no ':')"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and every bad field."""


Limit = Annotated[int | None, Field(gt=0)]  # null = no limit


def _auto_or_positive(value: Any) -> Any:
    """'auto' or a positive integer, else one message (pydantic gives one per union member)."""
    if value == "auto" or (type(value) is int and value > 0):
        return value
    raise ValueError(f"Input should be 'auto' or a positive integer (got {value!r})")


# The JSON schema states the positive bound too, which the validator alone would not show.
AutoOrPositive = Annotated[
    int | Literal["auto"],
    BeforeValidator(_auto_or_positive),
    WithJsonSchema({"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"const": "auto"}]}),
]


class Section(BaseModel):
    """A config section: unknown keys are errors, read-only; defaults are validated too."""

    # validate_default: default paths must resolve against base_dir just as written ones do.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)
