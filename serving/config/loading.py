"""Reading a config: YAML in, ServeConfig out, or one ConfigError naming every bad field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from serving.config.section import ConfigError
from serving.config.serve_config import ServeConfig


def parse_config(data: dict, base_dir: Path | None = None) -> ServeConfig:
    """Validate an in-memory config; relative paths resolve against base_dir or the cwd."""
    return _validate(data, base_dir, "config")


def load_config(path: str | Path, base_dir: Path | None = None) -> ServeConfig:
    """Read and validate a YAML config; relative paths resolve against base_dir or the cwd."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the config file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: the config file is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{source}: invalid YAML: {where}{problem}") from None
    return _validate({} if data is None else data, base_dir, source)  # empty file: defaults


def _validate(data: Any, base_dir: Path | None, source: str) -> ServeConfig:
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections "
            f"({', '.join(ServeConfig.model_fields)}), got {type(data).__name__}"
        )
    try:
        return ServeConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    """Every error as 'dotted.field: message', joined into one paragraph."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        where = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            section = _section_at(loc[:-1])
            under = ".".join(str(p) for p in loc[:-1]) or "the top level"
            allowed = ", ".join(section.model_fields) if section else "none"
            parts.append(f"{where}: unknown key {loc[-1]!r}; allowed under {under}: {allowed}")
            continue
        msg = " ".join(err["msg"].removeprefix("Value error, ").split())
        if err["type"] == "model_type":  # pydantic names our class; a user wrote YAML
            msg = "Input should be a mapping of keys"
        # Validators' own messages quote the value already; pydantic's range messages do not.
        if err["type"] != "value_error" and isinstance(err.get("input"), str | int | float):
            msg += f" (got {err['input']!r})"
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _section_at(loc: tuple) -> type[BaseModel] | None:
    """The model class at a location inside ServeConfig, or None if it is not a section."""
    model: type[BaseModel] = ServeConfig
    parts = iter(loc)
    for part in parts:
        kind = model.model_fields[part].annotation if part in model.model_fields else None
        if get_origin(kind) is dict:  # {name: section}: the next part is a name, not a field
            kind = get_args(kind)[1]
            next(parts, None)
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            return None
        model = kind
    return model
