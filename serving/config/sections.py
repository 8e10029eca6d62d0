"""The config's sections: pydantic models, every key with its default and description.

Unknown keys are errors at every level, so a typo never silently falls back to a default.
Paths and URLs resolve once, at load time (serving/config/locations.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from serving.config.locations import LocalPath, ModelLocation, RegistryURI, SqliteURI

MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MODEL_ID_RULE = "use 1-64 of A-Z, a-z, 0-9, '.', '_', '-', starting with a letter or digit (no ':')"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and every bad field."""


Limit = Annotated[int | None, Field(gt=0)]  # null = no limit
Quant = Literal["auto", "fp8", "none"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Method = Literal["none", "draft_model", "ngram"]


def _auto_or_positive(value: Any) -> Any:
    """'auto' or a positive integer, else one message (pydantic gives one per union member)."""
    if value == "auto" or (type(value) is int and value > 0):
        return value
    raise ValueError(f"Input should be 'auto' or a positive integer (got {value!r})")


class _Section(BaseModel):
    """A config section: unknown keys are errors, read-only; defaults are validated too."""

    # validate_default: default paths must resolve against base_dir just as written ones do.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)


class ModelSection(_Section):
    """The base model served."""

    id: str = Field("demo", description="Name clients pass as `model`; 1-64 of [A-Za-z0-9._-].")
    path: ModelLocation = Field(
        Path("models/demo/base"),
        description="Hugging Face model folder, or an fsspec URL (s3://...) copied once into "
        "~/.cache/loraserve/models.",
    )
    quantization: Quant = Field(
        "auto",
        description="auto = FP8 on CUDA sm_89+ or for an FP8 checkpoint, else as it is stored.",
    )
    dtype: DType = Field("auto", description="auto = the checkpoint's torch_dtype.")
    max_model_len: int = Field(2048, gt=0, description="Longest prompt + output, in tokens.")
    cuda_graphs: bool = Field(
        True, description="On a GPU, replay decode steps from CUDA graphs (no effect on a CPU)."
    )

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        # ':' would make 'model:adapter' references ambiguous; the pattern excludes it.
        if not MODEL_ID_RE.match(value):
            raise ValueError(f"invalid model id {value!r}: {MODEL_ID_RULE}")
        return value


class DraftSection(_Section):
    """Speculative decoding: how draft tokens are proposed and when speculation runs."""

    method: Method = Field("none", description="none = off; ngram = prompt lookup; draft_model.")
    path: ModelLocation = Field(
        Path("models/demo/draft"), description="The draft_model's folder, or an fsspec URL."
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="Tokens proposed per step.")
    ngram_min: int = Field(1, ge=1, description="Shortest n-gram matched (method ngram).")
    ngram_max: int = Field(4, ge=1, description="Longest n-gram matched (method ngram).")
    # Above this many running sequences verifying drafts costs more than it saves.
    max_batch_size: int = Field(8, ge=0, description="Speculate up to this many seqs; 0 = all.")
    adaptive: bool = Field(True, description="Speculate fewer tokens when few are accepted.")

    @model_validator(mode="after")
    def _check_ngram(self) -> DraftSection:
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min {self.ngram_min} exceeds ngram_max {self.ngram_max}")
        return self


class LoraSection(_Section):
    """LoRA adapters: their device and host memory, where they are published, which load."""

    slab_mb: int | Literal["auto"] = Field(
        "auto",
        description="Device memory for adapters, in MiB, per replica (a draft model's slab "
        "holds as many adapters again); auto = 10% of the GPU memory free once the model is "
        "loaded, or on a CPU 5% of the RAM available, at most 256 MiB. A rank-r adapter takes "
        "ceil(r / 8) pages of 8 rank rows.",
    )
    host_mb: int | Literal["auto"] = Field(
        "auto",
        description="Host memory for adapters evicted from the device, in MiB, per replica; "
        "auto = 25% of the machine's physical memory (or its container's limit). The least "
        "recently used go first.",
    )
    max_loras: Limit = Field(
        None,
        description="null = slab_mb sizes the device slab; a number = the slab holds this "
        "many adapters of max_lora_rank (set it or slab_mb, not both).",
    )
    max_lora_rank: int = Field(64, gt=0, description="Highest adapter rank accepted.")
    max_cpu_loras: Limit = Field(
        None, description="Adapters in host memory at most (within host_mb); null = no count."
    )
    embeddings: bool = Field(
        False,
        description="Also serve LoRA on embed_tokens and lm_head (vocabulary-wide slab stacks).",
    )
    max_trainable_tokens: int = Field(
        64,
        ge=0,
        description="Token rows of its own an adapter may bring (trainable_token_indices).",
    )
    registry: RegistryURI = Field("file://./registry", description="An fsspec URL or a folder.")
    # Names are checked where they are published, at start-up: config imports nothing of ours.
    preload: dict[str, LocalPath] = Field({}, description="Loaded at start: {name: path}.")

    @field_validator("slab_mb", "host_mb", mode="before")
    @classmethod
    def _check_mb(cls, value: Any) -> Any:
        return _auto_or_positive(value)

    @model_validator(mode="after")
    def _check_slab_size(self) -> LoraSection:
        if self.max_loras is not None and self.slab_mb != "auto":
            raise ValueError(
                f"max_loras ({self.max_loras}) and slab_mb ({self.slab_mb}) both size the "
                "device slab; set one of them"
            )
        return self


class CacheSection(_Section):
    """The paged KV cache."""

    block_size: int = Field(16, gt=0, description="Tokens per KV block.")
    num_blocks: int | Literal["auto"] = Field("auto", description="auto = what free memory holds.")
    prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prompt prefixes.")

    @field_validator("num_blocks", mode="before")
    @classmethod
    def _check_num_blocks(cls, value: Any) -> Any:
        return _auto_or_positive(value)


class SchedulerSection(_Section):
    """Continuous batching limits, per engine step."""

    max_num_seqs: int = Field(64, gt=0, description="Sequences running at once.")
    max_num_batched_tokens: int = Field(2048, ge=1, description="Tokens computed per step.")


class ServerSection(_Section):
    """The HTTP server."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on.")
    api_keys_file: LocalPath | None = Field(None, description="API keys, one a line; null = open.")
    insecure: bool = Field(
        False, description="Serve beyond loopback even with no API keys (every caller is admin)."
    )
    max_body_mb: int = Field(
        32,
        gt=0,
        description="Largest request body accepted, in MiB. Batch payloads have "
        "batch.max_payload_mb, and adapter uploads a limit of their own: the largest float32 "
        "adapter the served model takes at lora.max_lora_rank (never below this).",
    )
    max_queue: int = Field(256, gt=0, description="Waiting requests before answering 429.")
    stream_interval_ms: float = Field(
        100, ge=0, description="Longest pause between a stream's messages under load; 0 = each."
    )


class ResourcesSection(_Section):
    """Ray resources reserved per replica (fractions allowed, as in Ray)."""

    num_gpus: float = Field(0, ge=0, description="GPUs per replica.")
    num_cpus: float = Field(1, ge=0, description="CPUs per replica.")


class DeploySection(_Section):
    """Replicas behind one endpoint (Ray Serve)."""

    num_replicas: int = Field(1, gt=0, description="Engine replicas.")
    ray_address: str | None = Field(None, description="auto, ray://host:port; null = local.")
    resources: ResourcesSection = Field({}, description="Ray resources per replica.")


class BatchSection(_Section):
    """The batch API: jobs of many requests, stored until done, run in idle capacity."""

    store: SqliteURI = Field("sqlite:///./loraserve-batch.db", description="Job database URL.")
    max_payload_mb: int = Field(10, gt=0, description="Largest batch submission or file, in MiB.")
    ttl_hours: float = Field(72, gt=0, description="Finished jobs' results are kept this long.")
    # Per replica: the store, not the engine's queue, holds the rest of the backlog.
    max_in_flight: int = Field(8, gt=0, description="Batch items running at once, per replica.")
    # Kept free for what already-accepted batches still write (results, the WAL's checkpoint)
    # and for the usage store, which shares the volume in the chart: 256 MiB is 25 of the
    # largest payloads, yet a small share of any disk a server runs on.
    min_free_mb: int = Field(
        256,
        ge=0,
        description="New files and batches get 507 once the store's disk would have less free "
        "than this, in MiB; 0 = no check.",
    )


class UsageSection(_Section):
    """Usage metering: requests and tokens counted per tenant, key and adapter."""

    store: SqliteURI = Field("sqlite:///./loraserve-usage.db", description="Usage database URL.")


class TenantLimitsSection(_Section):
    """One tenant's limits; null = no limit."""

    requests_per_minute: Limit = Field(None, description="Requests admitted in any 60 s.")
    tokens_per_minute: Limit = Field(None, description="Tokens (prompt + output) in any 60 s.")
    concurrent_requests: Limit = Field(None, description="Requests running at once.")
    max_adapters: Limit = Field(None, description="Adapters the tenant may own.")
    max_adapter_mb: Limit = Field(None, description="Total MB of all stored versions of its names.")
    # The defaults bound what one key can make the server store (each batch item skips the
    # rate limits) far above a single tenant's use: two of the largest (50,000-request)
    # batches queued, and a thousand files or 1 GiB of them, a tenth of the chart's volume.
    batch_queued_requests: Limit = Field(
        100_000, description="Batch requests queued or running at once, over all its batches."
    )
    batch_files: Limit = Field(1000, description="Uploaded files (POST /v1/files) it may keep.")
    batch_file_mb: Limit = Field(1024, description="Total MiB of the uploaded files it keeps.")


class LimitsSection(TenantLimitsSection):
    """The default limits; `tenants` replaces them key by key (a null given = no limit)."""

    tenants: dict[str, TenantLimitsSection] = Field({}, description="{tenant: its overrides}.")

    @field_validator("tenants")
    @classmethod
    def _check_tenants(cls, value: dict) -> dict:
        for name in value:  # tenant names follow the model id's rule
            if not MODEL_ID_RE.match(name):
                raise ValueError(f"invalid tenant name {name!r}: {MODEL_ID_RULE}")
        return value

    @field_serializer("tenants")
    def _dump_tenants(self, value: dict) -> dict:
        # Only the keys written: a dumped config read back must not turn "absent" into null.
        return {name: limits.model_dump(exclude_unset=True) for name, limits in value.items()}

    def for_tenant(self, name: str) -> dict[str, int | None]:
        """The limits of one tenant: each key its override gives, else the default."""
        override = self.tenants.get(name)
        given = override.model_fields_set if override is not None else set()
        keys = TenantLimitsSection.model_fields
        return {key: getattr(override if key in given else self, key) for key in keys}

    def any_set(self, *keys: str) -> bool:
        """Whether any of these limits (all by default) is set, by default or for a tenant."""
        keys = keys or tuple(TenantLimitsSection.model_fields)
        return any(getattr(s, k) is not None for s in (self, *self.tenants.values()) for k in keys)


class ServeConfig(_Section):
    """The whole server configuration; every section is optional ({} = all its defaults)."""

    model: ModelSection = Field({}, description="Base model.")
    draft: DraftSection = Field({}, description="Speculation.")
    lora: LoraSection = Field({}, description="LoRA adapters.")
    cache: CacheSection = Field({}, description="KV cache.")
    scheduler: SchedulerSection = Field({}, description="Batch limits.")
    server: ServerSection = Field({}, description="HTTP server.")
    deploy: DeploySection = Field({}, description="Replicas.")
    batch: BatchSection = Field({}, description="Batch API.")
    usage: UsageSection = Field({}, description="Usage metering.")
    limits: LimitsSection = Field({}, description="Per-tenant limits.")

    @model_validator(mode="before")
    @classmethod
    def _fill_sections(cls, data: Any) -> Any:
        # An empty section (`lora:` alone in YAML is null) means all its defaults, as if absent.
        if isinstance(data, dict):
            data = {**data, **{k: {} for k in cls.model_fields if data.get(k) is None}}
        return data
