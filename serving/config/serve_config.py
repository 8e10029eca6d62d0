"""The whole configuration: one section per part of the server, each optional."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from serving.config.engine_sections import (
    CacheSection,
    DraftSection,
    LoraSection,
    ModelSection,
    SchedulerSection,
)
from serving.config.section import Section
from serving.config.service_sections import (
    BatchSection,
    DeploySection,
    LimitsSection,
    ServerSection,
    UsageSection,
)


class ServeConfig(Section):
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
