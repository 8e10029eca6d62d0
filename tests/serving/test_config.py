"""serving.config: defaults, path resolution, round trips, and one clear message per bad field."""

from pathlib import Path

import pydantic
import pytest
import yaml

from serving.config import (
    CacheSection,
    ConfigError,
    ServeConfig,
    load_config,
    parse_config,
)

FULL_YAML = """\
model: {id: Llama-3.1_8B, path: models/llama, quantization: fp8, dtype: bfloat16,
        max_model_len: 4096}
draft: {method: ngram, path: models/draft, num_speculative_tokens: 6, ngram_min: 2,
        ngram_max: 5, max_batch_size: 0, adaptive: false}
lora:
  max_loras: 8
  max_lora_rank: 32
  max_cpu_loras: 64
  registry: file://./reg
  preload: {support-bot: adapters/support, sql.v2: adapters/sql.tar.gz}
cache: {block_size: 32, num_blocks: 1000, prefix_caching: false}
scheduler: {max_num_seqs: 32, max_num_batched_tokens: 512}
server: {host: 0.0.0.0, port: 9000, api_keys_file: keys.txt, max_body_mb: 8, max_queue: 10}
deploy: {num_replicas: 2, ray_address: auto, resources: {num_gpus: 0.5, num_cpus: 2}}
batch: {store: "sqlite:///./jobs.db", max_payload_mb: 20}
"""


def _write(tmp_path: Path, text: str, name: str = "serve.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(data, base_dir=None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, base_dir=base_dir)
    return str(info.value)


# The design doc's table, ROOT standing for the folder relative paths resolve against.
CONTRACT = """\
model: {id: demo, path: ROOT/models/demo/base, quantization: auto, dtype: auto,
        max_model_len: 2048}
draft: {method: none, path: ROOT/models/demo/draft, num_speculative_tokens: 4, ngram_min: 1,
        ngram_max: 4, max_batch_size: 8, adaptive: true}
lora: {max_loras: 16, max_lora_rank: 64, max_cpu_loras: 128, registry: "file://ROOT/registry",
       preload: {}}
cache: {block_size: 16, num_blocks: auto, prefix_caching: true}
scheduler: {max_num_seqs: 64, max_num_batched_tokens: 2048}
server: {host: 127.0.0.1, port: 8000, api_keys_file: null, max_body_mb: 32, max_queue: 256,
         stream_interval_ms: 100}
deploy: {num_replicas: 1, ray_address: null, resources: {num_gpus: 0, num_cpus: 1}}
batch: {store: "sqlite:///ROOT/loraserve-batch.db", max_payload_mb: 10}
"""


def test_defaults_match_the_contract(tmp_path):
    expected = yaml.safe_load(CONTRACT.replace("ROOT", str(tmp_path)))
    assert parse_config({}, base_dir=tmp_path).model_dump(mode="json") == expected


def test_every_field_is_documented():
    sections = [ServeConfig, *(f.annotation for f in ServeConfig.model_fields.values())]
    sections.append(
        ServeConfig.model_fields["deploy"].annotation.model_fields["resources"].annotation
    )
    for section in sections:
        assert section.model_config["extra"] == "forbid", section
        for name, field in section.model_fields.items():
            assert field.description, f"{section.__name__}.{name} has no description"


def test_without_base_dir_paths_resolve_against_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cfg in (ServeConfig(), parse_config({}), load_config(_write(tmp_path, ""))):
        assert cfg.model.path == tmp_path / "models/demo/base"
        assert cfg.lora.registry == f"file://{tmp_path}/registry"
        assert cfg.batch.store == f"sqlite:///{tmp_path}/loraserve-batch.db"


def test_empty_sections_mean_their_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, "lora:\ncache: {}\n"), base_dir=tmp_path)
    assert cfg == parse_config({}, base_dir=tmp_path)
    assert cfg.lora.max_loras == 16


def test_full_yaml_loads_and_round_trips(tmp_path):
    cfg = load_config(_write(tmp_path, FULL_YAML), base_dir=tmp_path)
    assert cfg.model.id == "Llama-3.1_8B"
    assert cfg.model.quantization == "fp8"
    assert cfg.draft.method == "ngram"
    assert (cfg.draft.ngram_min, cfg.draft.ngram_max, cfg.draft.max_batch_size) == (2, 5, 0)
    assert cfg.draft.adaptive is False
    assert cfg.cache.num_blocks == 1000
    assert cfg.server.port == 9000
    assert cfg.deploy.resources.num_gpus == 0.5
    assert cfg.batch.max_payload_mb == 20
    # Resolved values are absolute, so resolving them again changes nothing.
    assert parse_config(cfg.model_dump(), base_dir=tmp_path / "elsewhere") == cfg
    dumped = yaml.safe_dump(cfg.model_dump(mode="json"))
    assert load_config(_write(tmp_path, dumped, "again.yaml"), base_dir=Path("/")) == cfg


def test_relative_paths_resolve_against_base_dir(tmp_path):
    cfg = load_config(_write(tmp_path, FULL_YAML), base_dir=tmp_path / "root")
    root = tmp_path / "root"
    assert cfg.model.path == root / "models/llama"
    assert cfg.draft.path == root / "models/draft"
    assert cfg.lora.preload == {
        "support-bot": root / "adapters/support",
        "sql.v2": root / "adapters/sql.tar.gz",
    }
    assert cfg.server.api_keys_file == root / "keys.txt"
    assert cfg.lora.registry == f"file://{root}/reg"
    assert cfg.batch.store == f"sqlite:///{root}/jobs.db"
    plain = parse_config({"lora": {"registry": "shared/reg"}}, base_dir=root)
    assert plain.lora.registry == f"file://{root}/shared/reg"  # a folder becomes a file:// URI


def test_absolute_paths_and_in_memory_sqlite_are_kept(tmp_path):
    cfg = parse_config(
        {
            "model": {"path": "/srv/base"},
            "lora": {"registry": "file:///srv/reg", "preload": {"a": "/srv/a"}},
            "batch": {"store": "sqlite:////srv/jobs.db"},
        },
        base_dir=tmp_path,
    )
    memory = parse_config({"batch": {"store": "sqlite:///:memory:"}}, base_dir=tmp_path)
    assert memory.batch.store == "sqlite:///:memory:"
    assert cfg.model.path == Path("/srv/base")
    assert cfg.lora.registry == "file:///srv/reg"
    assert cfg.lora.preload == {"a": Path("/srv/a")}
    assert cfg.batch.store == "sqlite:////srv/jobs.db"


@pytest.mark.parametrize("uri", ["s3://bucket/registry", "memory://registry", "gs://b/r"])
def test_other_fsspec_uris_stay_untouched(tmp_path, uri):
    assert parse_config({"lora": {"registry": uri}}, base_dir=tmp_path).lora.registry == uri


def test_non_sqlite_store_is_rejected():
    msg = _error({"batch": {"store": "postgresql://db/jobs"}})
    assert msg.startswith("config: batch.store: 'postgresql://db/jobs' is not a sqlite:///<path>")


def test_a_url_where_a_local_path_belongs_is_rejected():
    msg = _error({"lora": {"preload": {"a": "s3://bucket/a"}}})
    assert "lora.preload.a: 's3://bucket/a' is a URL; a local path is expected here" in msg
    assert "model.path: a path is required" in _error({"model": {"path": ""}})


def test_unknown_top_level_key_is_named_with_the_allowed_ones():
    msg = _error({"modle": {"id": "x"}})
    assert msg == (
        "config: modle: unknown key 'modle'; allowed under the top level: "
        "model, draft, lora, cache, scheduler, server, deploy, batch"
    )


def test_unknown_nested_keys_are_named(tmp_path):
    path = _write(tmp_path, "lora: {max_lora: 4}\ndeploy: {resources: {gpus: 1}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ")
    assert (
        "lora.max_lora: unknown key 'max_lora'; allowed under lora: "
        "max_loras, max_lora_rank, max_cpu_loras, registry, preload" in msg
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
        ("cache", "block_size", 0, "Input should be greater than 0"),
        ("scheduler", "max_num_seqs", 0, "Input should be greater than 0"),
        ("scheduler", "max_num_batched_tokens", 0, "Input should be greater than or equal to 1"),
        ("server", "port", 0, "Input should be greater than or equal to 1 (got 0)"),
        ("server", "port", 65536, "Input should be less than or equal to 65535 (got 65536)"),
        ("server", "max_body_mb", 0, "Input should be greater than 0"),
        ("server", "max_queue", 0, "Input should be greater than 0"),
        ("deploy", "num_replicas", 0, "Input should be greater than 0"),
        ("batch", "max_payload_mb", 0, "Input should be greater than 0"),
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


@pytest.mark.parametrize("model_id", ["a:b", "-demo", "x" * 65, "dé", "a/b"])
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
