"""The HTTP layer: OpenAI and Workers-AI routes, adapter management, auth, metrics."""

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
