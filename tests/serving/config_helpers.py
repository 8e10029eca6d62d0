"""Helpers of the config tests: write a YAML file, catch a config error's message."""

from pathlib import Path

import pytest

from serving.config import ConfigError, parse_config


def _write(tmp_path: Path, text: str, name: str = "serve.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(data, base_dir=None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir=base_dir)
    return str(info.value)
