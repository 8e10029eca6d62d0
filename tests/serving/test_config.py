"""serving.config: defaults, path resolution, round trips, and one clear message per bad field."""

from pathlib import Path

import pytest
import yaml

from serving.config import (
    LimitsSection,
    ServeConfig,
    TenantLimitsSection,
    load_config,
    parse_config,
)
from serving.usage.limits import RATE_LIMITS
from tests.serving.config_helpers import _error, _write

FULL_YAML = """\
model: {id: Llama-3.1_8B, path: models/llama, quantization: fp8, dtype: bfloat16,
        max_model_len: 4096, cuda_graphs: false}
draft: {method: ngram, path: models/draft, num_speculative_tokens: 6, ngram_min: 2,
        ngram_max: 5, max_batch_size: 0, adaptive: false}
lora:
  max_loras: 8
  max_lora_rank: 32
  max_cpu_loras: 64
  host_mb: 2048
  registry: file://./reg
  preload: {support-bot: adapters/support, sql.v2: adapters/sql.tar.gz}
cache: {block_size: 32, num_blocks: 1000, prefix_caching: false}
scheduler: {max_num_seqs: 32, max_num_batched_tokens: 512}
server: {host: 0.0.0.0, port: 9000, api_keys_file: keys.txt, max_body_mb: 8, max_queue: 10}
deploy: {num_replicas: 2, ray_address: auto, resources: {num_gpus: 0.5, num_cpus: 2}}
batch: {store: "sqlite:///./jobs.db", max_payload_mb: 20}
usage: {store: "sqlite:///./usage.db"}
limits:
  requests_per_minute: 60
  tokens_per_minute: 100000
  concurrent_requests: 4
  max_adapters: 10
  max_adapter_mb: 200
  batch_queued_requests: 5000
  tenants:
    acme: {requests_per_minute: 600, concurrent_requests: null}
    beta.team_2: {}
"""


# The design doc's table, ROOT standing for the folder relative paths resolve against; plus
# model.cuda_graphs and model.tool_call_format, which the project adds to it, and the lora section's memory
# in MiB (slab_mb, host_mb), which leaves its adapter counts unset by default.
CONTRACT = """\
model: {id: demo, path: ROOT/models/demo/base, quantization: auto, dtype: auto,
        max_model_len: 2048, cuda_graphs: true, tool_call_format: auto}
draft: {method: none, path: ROOT/models/demo/draft, num_speculative_tokens: 4, ngram_min: 1,
        ngram_max: 4, max_batch_size: 8, adaptive: true}
lora: {slab_mb: auto, host_mb: auto, max_loras: null, max_lora_rank: 64, max_cpu_loras: null,
       embeddings: false, max_trainable_tokens: 64, registry: "file://ROOT/registry",
       preload: {}}
cache: {block_size: 16, num_blocks: auto, prefix_caching: true}
scheduler: {max_num_seqs: 64, max_num_batched_tokens: 2048}
server: {host: 127.0.0.1, port: 8000, api_keys_file: null, insecure: false, max_body_mb: 32,
         max_queue: 256, stream_interval_ms: 100}
deploy: {num_replicas: 1, ray_address: null, resources: {num_gpus: 0, num_cpus: 1}}
batch: {store: "sqlite:///ROOT/loraserve-batch.db", max_payload_mb: 10, ttl_hours: 72,
       max_in_flight: 8, min_free_mb: 256}
usage: {store: "sqlite:///ROOT/loraserve-usage.db"}
limits: {requests_per_minute: null, tokens_per_minute: null, concurrent_requests: null,
         max_adapters: null, max_adapter_mb: null, batch_queued_requests: 100000,
         batch_files: 1000, batch_file_mb: 1024, tenants: {}}
"""


def test_defaults_match_the_contract(tmp_path):
    expected = yaml.safe_load(CONTRACT.replace("ROOT", str(tmp_path)))
    assert parse_config({}, base_dir=tmp_path).model_dump(mode="json") == expected


def test_every_field_is_documented():
    sections = [ServeConfig, *(f.annotation for f in ServeConfig.model_fields.values())]
    sections.append(
        ServeConfig.model_fields["deploy"].annotation.model_fields["resources"].annotation
    )
    sections.append(TenantLimitsSection)
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
        assert cfg.usage.store == f"sqlite:///{tmp_path}/loraserve-usage.db"


def test_empty_sections_mean_their_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, "lora:\ncache: {}\n"), base_dir=tmp_path)
    assert cfg == parse_config({}, base_dir=tmp_path)
    assert (cfg.lora.slab_mb, cfg.lora.host_mb, cfg.lora.max_loras) == ("auto", "auto", None)


def test_full_yaml_loads_and_round_trips(tmp_path):
    cfg = load_config(_write(tmp_path, FULL_YAML), base_dir=tmp_path)
    assert cfg.model.id == "Llama-3.1_8B"
    assert cfg.model.quantization == "fp8"
    assert cfg.model.cuda_graphs is False
    assert cfg.draft.method == "ngram"
    assert (cfg.draft.ngram_min, cfg.draft.ngram_max, cfg.draft.max_batch_size) == (2, 5, 0)
    assert cfg.draft.adaptive is False
    assert cfg.cache.num_blocks == 1000
    assert cfg.server.port == 9000
    assert cfg.deploy.resources.num_gpus == 0.5
    assert cfg.batch.max_payload_mb == 20
    assert cfg.limits.tokens_per_minute == 100000
    assert set(cfg.limits.tenants) == {"acme", "beta.team_2"}
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
    assert cfg.usage.store == f"sqlite:///{root}/usage.db"
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


@pytest.mark.parametrize("section", ["model", "draft"])
def test_a_model_at_an_fsspec_url_is_kept_and_a_file_url_is_a_folder(tmp_path, section):
    url = "s3://bucket/models/llama"
    assert getattr(parse_config({section: {"path": url}}), section).path == url
    local = parse_config({section: {"path": "file://models/x"}}, base_dir=tmp_path)
    assert getattr(local, section).path == tmp_path / "models" / "x"


def test_non_sqlite_store_is_rejected():
    msg = _error({"batch": {"store": "postgresql://db/jobs"}})
    assert msg.startswith("config: batch.store: 'postgresql://db/jobs' is not a sqlite:///<path>")


def test_a_url_where_a_local_path_belongs_is_rejected():
    msg = _error({"lora": {"preload": {"a": "s3://bucket/a"}}})
    assert "lora.preload.a: 's3://bucket/a' is a URL; a local path is expected here" in msg
    assert "model.path: a path is required" in _error({"model": {"path": ""}})


def test_the_device_slab_is_sized_in_adapters_or_in_mib_not_both():
    counted = parse_config({"lora": {"max_loras": 8, "slab_mb": "auto"}}).lora
    assert (counted.max_loras, counted.slab_mb) == (8, "auto")
    assert parse_config({"lora": {"slab_mb": 512, "host_mb": 4096}}).lora.slab_mb == 512
    msg = _error({"lora": {"max_loras": 8, "slab_mb": 512}})
    assert msg == (
        "config: lora: max_loras (8) and slab_mb (512) both size the device slab; set one of them"
    )


def test_usage_store_in_memory_is_kept(tmp_path):
    cfg = parse_config({"usage": {"store": "sqlite:///:memory:"}}, base_dir=tmp_path)
    assert cfg.usage.store == "sqlite:///:memory:"


def _limits(cfg):
    return {key: getattr(cfg, key) for key in TenantLimitsSection.model_fields}


def test_a_tenant_override_replaces_only_the_keys_it_gives(tmp_path):
    limits = load_config(_write(tmp_path, FULL_YAML)).limits
    defaults = {
        "requests_per_minute": 60,
        "tokens_per_minute": 100000,
        "concurrent_requests": 4,
        "max_adapters": 10,
        "max_adapter_mb": 200,
        "batch_queued_requests": 5000,
        "batch_files": 1000,
        "batch_file_mb": 1024,
    }
    assert _limits(limits) == defaults
    # An explicit null is "no limit" for that tenant, not "fall back to the default".
    assert limits.for_tenant("acme") == {
        **defaults,
        "requests_per_minute": 600,
        "concurrent_requests": None,
    }
    assert limits.for_tenant("beta.team_2") == defaults  # an empty override changes nothing
    assert limits.for_tenant("unknown") == defaults


def test_limits_overrides_survive_a_dump_and_reload(tmp_path):
    cfg = load_config(_write(tmp_path, FULL_YAML), base_dir=tmp_path)
    dumped = yaml.safe_dump(cfg.model_dump(mode="json"))
    # Keys a tenant did not write must stay absent, or they would read back as null = no limit.
    assert yaml.safe_load(dumped)["limits"]["tenants"] == {
        "acme": {"requests_per_minute": 600, "concurrent_requests": None},
        "beta.team_2": {},
    }
    again = load_config(_write(tmp_path, dumped, "again.yaml")).limits
    for tenant in ("acme", "beta.team_2", "other"):
        assert again.for_tenant(tenant) == cfg.limits.for_tenant(tenant)


@pytest.mark.parametrize(
    ("data", "everything", "rates"),
    [
        ({}, True, False),  # the batch quotas have defaults
        ({"max_adapter_mb": 5}, True, False),
        ({"tokens_per_minute": 5}, True, True),
        ({"tenants": {"a": {"concurrent_requests": 1}}}, True, True),
        ({"tenants": {"a": {"requests_per_minute": None}}}, True, False),
    ],
)
def test_any_set_looks_at_the_defaults_and_every_tenant(data, everything, rates):
    limits = LimitsSection.model_validate(data)
    assert limits.any_set() is everything
    assert (
        limits.any_set("requests_per_minute", "tokens_per_minute", "concurrent_requests") is rates
    )


def test_the_demo_config_sets_no_rate_limits_and_the_default_quotas():
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "demo.yaml", base_dir=root)
    assert cfg.usage.store == f"sqlite:///{root}/.loraserve/usage.db"
    assert not cfg.limits.any_set(*RATE_LIMITS, "max_adapters", "max_adapter_mb")
    assert cfg.limits == LimitsSection() and cfg.batch.min_free_mb == 256
    assert cfg.limits.tenants == {}
