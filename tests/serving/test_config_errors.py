"""serving.config: one clear message per bad field, file or value."""

import pydantic
import pytest

from serving.config import CacheSection, ConfigError, load_config, parse_config
from tests.serving.config_helpers import _error, _write


def test_unknown_top_level_key_is_named_with_the_allowed_ones():
    msg = _error({"modle": {"id": "x"}})
    assert msg == (
        "config: modle: unknown key 'modle'; allowed under the top level: "
        "model, draft, lora, cache, scheduler, server, deploy, batch, usage, limits"
    )


def test_unknown_nested_keys_are_named(tmp_path):
    path = _write(tmp_path, "lora: {max_lora: 4}\ndeploy: {resources: {gpus: 1}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ")
    assert (
        "lora.max_lora: unknown key 'max_lora'; allowed under lora: "
        "slab_mb, host_mb, max_loras, max_lora_rank, max_cpu_loras, embeddings, "
        "max_trainable_tokens, registry, preload" in msg
    )
    assert (
        "deploy.resources.gpus: unknown key 'gpus'; allowed under deploy.resources: "
        "num_gpus, num_cpus" in msg
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("model", "max_model_len", 0, "Input should be greater than 0 (got 0)"),
        ("model", "quantization", "int4", "Input should be 'auto', 'fp8' or 'none' (got 'int4')"),
        ("model", "dtype", "fp64", "Input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
        ("draft", "method", "medusa", "Input should be 'none', 'draft_model' or 'ngram'"),
        ("draft", "num_speculative_tokens", 0, "Input should be greater than or equal to 1"),
        ("draft", "num_speculative_tokens", 17, "Input should be less than or equal to 16"),
        ("draft", "ngram_min", 0, "Input should be greater than or equal to 1"),
        ("draft", "max_batch_size", -1, "Input should be greater than or equal to 0 (got -1)"),
        ("lora", "max_loras", 0, "Input should be greater than 0 (got 0)"),
        ("lora", "max_lora_rank", -8, "Input should be greater than 0 (got -8)"),
        ("lora", "max_cpu_loras", "many", "Input should be a valid integer"),
        ("lora", "max_cpu_loras", 0, "Input should be greater than 0 (got 0)"),
        ("lora", "slab_mb", 0, "Input should be 'auto' or a positive integer (got 0)"),
        ("lora", "slab_mb", "1GB", "Input should be 'auto' or a positive integer (got '1GB')"),
        ("lora", "host_mb", -1, "Input should be 'auto' or a positive integer (got -1)"),
        ("lora", "host_mb", 1.5, "Input should be 'auto' or a positive integer (got 1.5)"),
        ("cache", "block_size", 0, "Input should be greater than 0"),
        ("scheduler", "max_num_seqs", 0, "Input should be greater than 0"),
        ("scheduler", "max_num_batched_tokens", 0, "Input should be greater than or equal to 1"),
        ("server", "port", 0, "Input should be greater than or equal to 1 (got 0)"),
        ("server", "port", 65536, "Input should be less than or equal to 65535 (got 65536)"),
        ("server", "max_body_mb", 0, "Input should be greater than 0"),
        ("server", "max_queue", 0, "Input should be greater than 0"),
        ("deploy", "num_replicas", 0, "Input should be greater than 0"),
        ("batch", "max_payload_mb", 0, "Input should be greater than 0"),
        ("limits", "requests_per_minute", 0, "Input should be greater than 0 (got 0)"),
        ("limits", "tokens_per_minute", -5, "Input should be greater than 0 (got -5)"),
        ("limits", "concurrent_requests", 1.5, "Input should be a valid integer"),
        ("limits", "max_adapters", "many", "Input should be a valid integer"),
        ("limits", "max_adapter_mb", 0, "Input should be greater than 0 (got 0)"),
        ("limits", "tenants", [], "Input should be a valid dictionary"),
    ],
)
def test_each_range_violation_names_its_dotted_field(section, key, value, expected):
    assert _error({section: {key: value}}).startswith(f"config: {section}.{key}: {expected}")


def test_a_negative_resource_names_its_nested_field():
    msg = _error({"deploy": {"resources": {"num_gpus": -1}}})
    assert (
        msg
        == "config: deploy.resources.num_gpus: Input should be greater than or equal to 0 (got -1)"
    )


def test_load_config_message_names_the_file_and_the_field(tmp_path):
    path = _write(tmp_path, "lora:\n  max_loras: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: lora.max_loras: Input should be greater than 0 (got 0)"


def test_all_errors_come_in_one_paragraph_without_pydantic_noise():
    msg = _error({"server": {"port": 0, "host": ""}, "cache": {"block_size": 0}, "x": 1})
    assert "\n" not in msg
    assert msg.count("; ") >= 3
    for field in ("server.port", "server.host", "cache.block_size", "x: unknown key"):
        assert field in msg
    assert "pydantic" not in msg and "validation error" not in msg


@pytest.mark.parametrize(
    ("text", "where"),
    [("lora: [1, 2\n", "line 2, column 1"), ("model:\n  id: demo\n bad: 1\n", "line 3")],
)
def test_bad_yaml(tmp_path, text, where):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: invalid YAML: {where}")
    assert "\n" not in msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such config file$"):
        load_config(path)


def test_a_folder_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path)


@pytest.mark.parametrize(("text", "kind"), [("- model\n- lora\n", "list"), ("hello\n", "str")])
def test_top_level_must_be_a_mapping(tmp_path, text, kind):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: the top level must be a mapping of sections")
    assert str(info.value).endswith(f"got {kind}")


def test_a_section_must_be_a_mapping():
    assert _error({"lora": 5}) == "config: lora: Input should be a mapping of keys (got 5)"


@pytest.mark.parametrize("value", ["auto", 1, 4096])
def test_num_blocks_accepts_auto_or_a_positive_int(value):
    assert CacheSection(num_blocks=value).num_blocks == value


@pytest.mark.parametrize("value", ["lots", "Auto", 0, -3, 1.5, True, None])
def test_num_blocks_rejects_anything_else(value):
    msg = _error({"cache": {"num_blocks": value}})
    assert msg == (
        f"config: cache.num_blocks: Input should be 'auto' or a positive integer (got {value!r})"
    )


@pytest.mark.parametrize("model_id", ["a:b", "-demo", "x" * 65, "dé", "a/b", "demo\n"])
def test_bad_model_id_is_rejected(model_id):
    msg = _error({"model": {"id": model_id}})
    assert msg.startswith(f"config: model.id: invalid model id {model_id!r}")


def test_good_model_ids_are_kept():
    for model_id in ("Llama-3.1_8B", "x" * 64, "7b"):
        assert parse_config({"model": {"id": model_id}}).model.id == model_id


def test_ngram_min_above_ngram_max_is_rejected():
    assert _error({"draft": {"ngram_min": 5, "ngram_max": 4}}) == (
        "config: draft: ngram_min 5 exceeds ngram_max 4"
    )
    assert parse_config({"draft": {"ngram_min": 3, "ngram_max": 3}}).draft.ngram_max == 3


def test_config_error_is_a_value_error_and_the_config_is_read_only():
    assert issubclass(ConfigError, ValueError)
    cfg = parse_config({})
    with pytest.raises(pydantic.ValidationError):
        cfg.server.port = 1


LIMIT_KEYS = (
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
    "max_adapters",
    "max_adapter_mb",
    "batch_queued_requests",
    "batch_files",
    "batch_file_mb",
)


@pytest.mark.parametrize("key", LIMIT_KEYS)
@pytest.mark.parametrize("value", [0, -1])
def test_a_tenant_limit_below_one_names_the_tenant_and_the_key(key, value):
    msg = _error({"limits": {"tenants": {"acme": {key: value}}}})
    assert msg == f"config: limits.tenants.acme.{key}: Input should be greater than 0 (got {value})"


@pytest.mark.parametrize("name", ["a b", "-acme", "x" * 65, "a:b", "a/b", ""])
def test_a_bad_tenant_name_is_rejected(name):
    msg = _error({"limits": {"tenants": {name: {"requests_per_minute": 1}}}})
    assert msg.startswith(f"config: limits.tenants: invalid tenant name {name!r}: use 1-64 of")


def test_an_unknown_key_in_a_tenant_override_names_the_allowed_ones():
    msg = _error({"limits": {"tenants": {"acme": {"rpm": 5}}}})
    assert msg == (
        "config: limits.tenants.acme.rpm: unknown key 'rpm'; allowed under limits.tenants.acme: "
        + ", ".join(LIMIT_KEYS)
    )
    assert _error({"limits": {"rpm": 5}}).endswith(", ".join((*LIMIT_KEYS, "tenants")))
    assert _error({"limits": {"tenants": {"acme": 5}}}) == (
        "config: limits.tenants.acme: Input should be a mapping of keys (got 5)"
    )


def test_non_sqlite_usage_store_is_rejected():
    msg = _error({"usage": {"store": "postgresql://db/usage"}})
    assert msg.startswith("config: usage.store: 'postgresql://db/usage' is not a sqlite:///<path>")
