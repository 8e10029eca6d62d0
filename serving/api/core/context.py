"""What every route reads: the settings, generator, metrics, tenancy and batch store of this app."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from serving.api.core.batch_store import BatchClient
from serving.api.core.generator import Generator
from serving.api.core.metrics import Metrics
from serving.api.core.settings import AppSettings
from serving.api.core.tenancy import TenancyClient


@dataclass(frozen=True)
class ApiContext:
    settings: AppSettings
    generator: Generator
    metrics: Metrics
    tenancy: TenancyClient
    batch: BatchClient


def api_context(request: Request) -> ApiContext:
    """The context of the app serving request (a FastAPI dependency)."""
    return request.app.state.context
