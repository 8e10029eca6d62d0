"""Where the config's files and stores are: paths and URLs, each resolved once at load time.

Relative paths, file:// and sqlite:/// URIs resolve against the working directory (or the
base_dir the loader is given); other fsspec URIs (s3://, memory://, ...) stay as written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo


def _base_dir(info: ValidationInfo) -> Path:
    """The folder relative paths resolve against: the caller's base_dir, else the cwd."""
    base = (info.context or {}).get("base_dir")
    return Path(base).absolute() if base is not None else Path.cwd()


def _local_path(value: Any, info: ValidationInfo) -> Any:
    """A local path made absolute against the base folder; URLs are refused here."""
    if not isinstance(value, str | os.PathLike):
        return value  # pydantic's own type error names what was given
    text = os.fspath(value)
    if not text:
        raise ValueError("a path is required")
    if "://" in text:
        raise ValueError(f"{text!r} is a URL; a local path is expected here")
    return _base_dir(info) / text  # an absolute text replaces the base


def _model_location(value: Any, info: ValidationInfo) -> Any:
    """A model folder made absolute, or an fsspec URL kept as given (s3://, memory://, ...):
    each process copies it once into its own cache (serving/model/checkpoint.py)."""
    if isinstance(value, str) and "://" in value and not value.startswith("file://"):
        return value
    if isinstance(value, str):
        value = value.removeprefix("file://")
    return _local_path(value, info)


def _registry_uri(value: Any, info: ValidationInfo) -> Any:
    """An fsspec URL; file:// URLs and plain folders become absolute file:// URLs."""
    if not isinstance(value, str | os.PathLike):
        return value
    text = os.fspath(value)
    if not text:
        raise ValueError("a URL or folder is required")
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    elif "://" in text:
        return text  # s3://, memory://, ...: the filesystem's own namespace, not ours
    # Not Path.as_uri(): it percent-encodes, and fsspec's local filesystem does not decode.
    return f"file://{_base_dir(info) / text}"


def _sqlite_uri(value: Any, info: ValidationInfo) -> Any:
    """A sqlite:///<path> URL with the path made absolute (sqlite:////abs/path)."""
    if not isinstance(value, str):
        return value
    if not value.startswith("sqlite:///"):
        raise ValueError(f"{value!r} is not a sqlite:///<path> URL, the only store supported")
    rest = value.removeprefix("sqlite:///")
    if not rest or rest == ":memory:":
        return "sqlite:///:memory:"
    return f"sqlite:///{_base_dir(info) / rest}"


LocalPath = Annotated[Path, BeforeValidator(_local_path)]
ModelLocation = Annotated[Path | str, BeforeValidator(_model_location)]
RegistryURI = Annotated[str, BeforeValidator(_registry_uri)]
SqliteURI = Annotated[str, BeforeValidator(_sqlite_uri)]
