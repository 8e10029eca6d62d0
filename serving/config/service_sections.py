"""The sections of how the engines are served: HTTP, replicas, batches, usage and limits."""

from __future__ import annotations

from pydantic import Field, field_serializer, field_validator

from serving.config.locations import LocalPath, SqliteURI
from serving.config.section import MODEL_ID_RE, MODEL_ID_RULE, Limit, Section


class ServerSection(Section):
    """The HTTP server."""

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on.")
    api_keys_file: LocalPath | None = Field(
        None,
        description="API keys, one a line: `KEY TENANT SCOPE`, scope user or admin (besides "
        "LORASERVE_API_KEYS); with neither, every caller is an admin.",
    )
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
        100,
        ge=0,
        description="Longest pause between a stream's messages under load (a stream waits "
        "open streams / 640 s, at most this; the tokens made meanwhile go in its next "
        "message); 0 = each token as it comes.",
    )


class ResourcesSection(Section):
    """Ray resources reserved per replica (fractions allowed, as in Ray)."""

    num_gpus: float = Field(0, ge=0, description="GPUs per replica.")
    num_cpus: float = Field(1, ge=0, description="CPUs per replica.")


class DeploySection(Section):
    """Replicas behind one endpoint (Ray Serve)."""

    num_replicas: int = Field(1, gt=0, description="Engine replicas.")
    ray_address: str | None = Field(
        None,
        description="A Ray cluster to run on: auto, HOST:PORT or ray://host:port; null = a "
        "private local Ray, stopped on exit.",
    )
    resources: ResourcesSection = Field({}, description="Ray resources per replica.")


class BatchSection(Section):
    """The batch API: jobs of many requests, stored until done, run in idle capacity."""

    store: SqliteURI = Field(
        "sqlite:///./loraserve-batch.db", description="Job database URL (SQLite, WAL)."
    )
    max_payload_mb: int = Field(10, gt=0, description="Largest batch submission or file, in MiB.")
    ttl_hours: float = Field(
        72,
        gt=0,
        description="Finished jobs, and uploaded files no unfinished job reads, are deleted "
        "this long after; a file's expires_at is this long after it was made.",
    )
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


class UsageSection(Section):
    """Usage metering: requests and tokens counted per tenant, key and adapter."""

    store: SqliteURI = Field("sqlite:///./loraserve-usage.db", description="Usage database URL.")


class TenantLimitsSection(Section):
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
