"""The server's configuration: one YAML file, validated by pydantic, every default documented.

Sections live in serving.config.sections, reading in serving.config.loading; this package
imports nothing else of ours, so every part of the server may import it.
"""

from serving.config.loading import load_config, parse_config
from serving.config.sections import (
    MODEL_ID_RE,
    MODEL_ID_RULE,
    BatchSection,
    CacheSection,
    ConfigError,
    DeploySection,
    DraftSection,
    LimitsSection,
    LoraSection,
    ModelSection,
    ResourcesSection,
    SchedulerSection,
    ServeConfig,
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
