"""Operations: /metrics (Prometheus), /healthz (liveness), /readyz (readiness). No key needed:
probes and scrapers carry none, and none of these reveal adapters or prompts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serving.api.context import ApiContext, api_context

router = APIRouter(tags=["Operations"])
Ctx = Annotated[ApiContext, Depends(api_context)]


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(ctx: Ctx) -> Response:
    figures = await ctx.generator.figures()
    return Response(ctx.metrics.render(figures), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: model loaded, preloads published, replicas up")
async def readyz(ctx: Ctx) -> JSONResponse:
    if ctx.settings.ready.is_set() and await ctx.generator.ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "starting"}, status_code=503)
