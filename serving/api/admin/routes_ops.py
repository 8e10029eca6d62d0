"""Operations: /metrics (Prometheus), /healthz (liveness), /readyz (readiness). No key needed:
probes and scrapers carry none. None of these reveal prompts, and /metrics shows adapter
names only to an admin key (or to anyone on a keyless server), pseudonyms to the rest."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serving.api.core.caller import Principal, caller_if_any
from serving.api.core.context import ApiContext, api_context

router = APIRouter(tags=["Operations"])
Ctx = Annotated[ApiContext, Depends(api_context)]


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(
    ctx: Ctx, caller: Annotated[Principal | None, Depends(caller_if_any)]
) -> Response:
    figures = await ctx.generator.figures()
    names = caller is not None and caller.is_admin
    return Response(
        ctx.metrics.render(figures, adapter_names=names), media_type=CONTENT_TYPE_LATEST
    )


# HEAD too: load balancers and Kubernetes' httpGet probes may ask with either.
@router.api_route("/healthz", methods=["GET", "HEAD"], summary="Liveness: the process answers")
async def healthz() -> dict:
    return {"status": "ok"}


@router.api_route(
    "/readyz", methods=["GET", "HEAD"],
    summary="Readiness: model loaded, preloads published, this replica taking requests",
)  # fmt: skip
async def readyz(ctx: Ctx) -> JSONResponse:
    if ctx.settings.ready.is_set() and await ctx.generator.ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "starting"}, status_code=503)
