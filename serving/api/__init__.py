"""The HTTP layer: one core (core/) with protocol wings (openai/, workers_ai/, batch/, admin/,
edge/) that never import each other; app.py assembles them."""

from serving.api.app import create_app
from serving.api.core.generator import Generator, LocalGenerator, QueueFull
from serving.api.core.settings import AppSettings, settings_from_config

__all__ = [
    "AppSettings",
    "Generator",
    "LocalGenerator",
    "QueueFull",
    "create_app",
    "settings_from_config",
]
