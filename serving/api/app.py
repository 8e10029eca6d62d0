"""The HTTP app: create_app(generator, settings) -> FastAPI, the same wherever it runs.

The app holds no model; a Generator does the generating (in this process or on replicas),
so this module has no notion of Ray. Start-up code builds AppSettings (settings_from_config),
serves the app, and sets settings.ready once the preloaded adapters are published.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from serving.api.admin import (
    routes_adapters,
    routes_dashboard,
    routes_ops,
    routes_stats,
    routes_usage,
)
from serving.api.batch import routes as routes_batch
from serving.api.batch.input import LineBodies
from serving.api.batch.items import run_item
from serving.api.batch.local_store import LocalBatch, memory_batch
from serving.api.core.batch_store import BatchClient
from serving.api.core.cloudflare_paths import ACCOUNT_PREFIXES
from serving.api.core.context import ApiContext
from serving.api.core.errors import install_error_handlers
from serving.api.core.generator import Generator
from serving.api.core.metrics import Metrics
from serving.api.core.quotas import num_tenant_locks
from serving.api.core.schema_rules import CHECKED_SCHEMAS, checked_schemas
from serving.api.core.settings import AppSettings, settings_from_config
from serving.api.core.tenancy import TenancyClient, memory_tenancy
from serving.api.edge.body_limits import BodyLimit
from serving.api.edge.gate import Gate
from serving.api.edge.keys import KeyRing
from serving.api.edge.request_id import RequestId
from serving.api.openai import routes as routes_openai
from serving.api.openai import routes_responses
from serving.api.openai.responses_schemas import ResponsesRequest
from serving.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from serving.api.workers_ai import accounts as routes_accounts
from serving.api.workers_ai import finetunes as routes_finetunes
from serving.api.workers_ai import models as routes_workers_models
from serving.api.workers_ai import routes as routes_workers_ai
from serving.api.workers_ai.json_body import WorkersJsonBody

__all__ = ["AppSettings", "create_app", "settings_from_config"]

# The routes a batch line may name, each with the body its route validates: the batch wing
# checks an uploaded file's lines with them.
LINE_BODIES: LineBodies = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
}


def create_app(
    generator: Generator,
    settings: AppSettings,
    tenancy: TenancyClient | None = None,
    batch: BatchClient | None = None,
) -> FastAPI:
    """The API over generator for the model settings describe; tenancy holds the tenants'
    limits and usage (default: settings' limits, usage kept in memory); batch, the batch
    store (default: in memory). A LocalBatch is fed by this app, each item run through it."""
    batch = batch if batch is not None else memory_batch()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if isinstance(batch, LocalBatch):
            batch.start()  # resume what a stopped server left, without waiting for a call
        yield
        if isinstance(batch, LocalBatch):
            await batch.stop()

    app = FastAPI(
        lifespan=lifespan,
        title="loraserve",
        summary="One base LLM and thousands of LoRA adapters, OpenAI and Workers-AI shaped.",
        version="0.1.0",
        # FastAPI's /docs and /redoc pages load their scripts from a CDN, on the dashboard's
        # origin and with no CSP; no installed package holds a copy to serve instead, so
        # they are off and /openapi.json alone describes the API.
        docs_url=None,
        redoc_url=None,
    )
    app.state.keys = KeyRing(settings.keys)
    app.state.line_bodies = LINE_BODIES
    metrics = Metrics(pseudonym_key=app.state.keys.secret)
    metrics.watch_registry(settings.registry)
    guesses = app.state.keys.guesses
    metrics.watch_state("key_guess_clients", lambda: (len(guesses), guesses.max_clients))
    metrics.watch_state("schema_checks", lambda: (checked_schemas(), CHECKED_SCHEMAS))
    metrics.watch_state("tenant_locks", lambda: (num_tenant_locks(), None))  # writes under way
    tenancy = tenancy if tenancy is not None else memory_tenancy(settings.limits_of)
    app.state.context = ApiContext(settings, generator, metrics, tenancy, batch)
    if isinstance(batch, LocalBatch):

        async def meter(item, result) -> None:  # once the item's result is committed
            if result.usage is not None:
                await tenancy.finish(None, result.usage, 0)

        batch.bind(lambda item: run_item(app, item), meter)
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes,
                       max_batch_bytes=settings.max_batch_bytes,
                       max_upload_bytes=settings.max_upload_bytes)  # fmt: skip
    app.add_middleware(WorkersJsonBody)
    # Added last, so it runs first: keys and browser checks before any body is read.
    app.add_middleware(Gate, ring=app.state.keys, check_host=not settings.insecure)
    # Outermost: even the gate's refusals name their request.
    app.add_middleware(RequestId)
    install_error_handlers(app)
    # The Workers-AI wing answers at /ai/... and under each of Cloudflare's account prefixes,
    # in the key's own account only.
    wing = (routes_workers_ai, routes_finetunes, routes_workers_models)
    for prefix in ACCOUNT_PREFIXES:
        in_account = [Depends(routes_accounts.in_account)]
        for module in wing:
            app.include_router(module.router, prefix=f"{prefix}/{{account_id}}",
                               dependencies=in_account,
                               include_in_schema=prefix == ACCOUNT_PREFIXES[0])  # fmt: skip
    routes = (*wing, routes_accounts, routes_openai, routes_responses, routes_batch, routes_adapters,
              routes_usage, routes_stats, routes_ops, routes_dashboard)  # fmt: skip
    for module in routes:
        app.include_router(module.router)
    return app
