"""The server's configuration: one YAML file, validated by pydantic, every default documented.

The whole is serving.config.serve_config; its sections are in engine_sections (what each
engine runs) and service_sections (how the engines are served), what they share in section;
reading in loading, paths in locations, the rendered reference (docs/config.md) in reference.
This package imports nothing else of ours, so every part of the server may import it.
"""

from serving.config.engine_sections import (
    CacheSection,
    DraftSection,
    LoraSection,
    ModelSection,
    SchedulerSection,
)
from serving.config.loading import load_config, parse_config
from serving.config.section import MODEL_ID_RE, MODEL_ID_RULE, ConfigError
from serving.config.serve_config import ServeConfig
from serving.config.service_sections import (
    BatchSection,
    DeploySection,
    LimitsSection,
    ResourcesSection,
    ServerSection,
    TenantLimitsSection,
    UsageSection,
)

__all__ = [
    "MODEL_ID_RE", "MODEL_ID_RULE", "BatchSection", "CacheSection", "ConfigError",
    "DeploySection", "DraftSection", "LimitsSection", "LoraSection", "ModelSection",
    "ResourcesSection", "SchedulerSection", "ServeConfig", "ServerSection",
    "TenantLimitsSection", "UsageSection", "load_config", "parse_config",
]  # fmt: skip
