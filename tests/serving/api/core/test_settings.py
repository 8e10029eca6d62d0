"""settings_from_config reads the model folder (config and tokenizer, not weights) and keys."""

import shutil

import pytest

from serving.api import create_app, settings_from_config
from serving.config import ConfigError, parse_config


def test_settings_from_config(world, tmp_path, monkeypatch):
    monkeypatch.delenv("LORASERVE_API_KEYS", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(world.base_dir / name, model / name)  # no weights: none are read
    (tmp_path / "keys").write_text("k1-0123456789abcdef acme user\n")
    cfg = parse_config(
        {
            "model": {"id": "tiny", "path": str(model), "max_model_len": 100000},
            "lora": {"registry": str(tmp_path / "reg"), "max_lora_rank": 8},
            "server": {"api_keys_file": str(tmp_path / "keys"), "max_body_mb": 3, "insecure": True},
        }
    )
    settings = settings_from_config(cfg)
    assert settings.model_id == "tiny" and settings.max_lora_rank == 8
    assert settings.max_model_len == 512  # the model's max_position_embeddings caps it
    assert settings.max_body_bytes == 3 * 2**20 and settings.vocab_size == 512
    assert settings.insecure  # server.insecure: the gate then leaves Host unchecked
    assert settings.keys["k1-0123456789abcdef"].tenant == "acme" and settings.draft_spec is None
    assert settings.base_spec.num_layers == 2 and settings.tokenizer.chat_template
    assert not settings.ready.is_set()
    assert create_app(generator=None, settings=settings).title == "loraserve"


@pytest.mark.parametrize(("dtype", "want"), [("auto", "float32"), ("float16", "float16")])
def test_adapters_are_bounded_in_the_dtype_served(world, tmp_path, dtype, want):
    """A configured model.dtype is the activations' range an upload is checked against."""
    cfg = parse_config(
        {
            "model": {"path": str(world.base_dir), "dtype": dtype},
            "lora": {"registry": str(tmp_path / "reg")},
        }
    )
    assert settings_from_config(cfg).base_spec.dtype == want


def test_a_bad_keys_file_stops_start_up(world, tmp_path):
    (tmp_path / "keys").write_text("k1 acme\n")
    cfg = parse_config(
        {
            "model": {"path": str(world.base_dir)},
            "server": {"api_keys_file": str(tmp_path / "keys")},
        }
    )
    with pytest.raises(ConfigError, match=r"keys, line 1: expected KEY TENANT SCOPE"):
        settings_from_config(cfg)
