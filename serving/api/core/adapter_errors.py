"""An adapters error as every route answers it: the one mapping of adapters.errors' types
to HTTP statuses and OpenAI codes (callers decide by type, never by a message's words)."""

from __future__ import annotations

import logging

from starlette.concurrency import run_in_threadpool

from adapters.errors import (
    AdapterError,
    NameConflict,
    NotOwner,
    RegistryCorrupt,
    RegistryUnavailable,
    UnknownAdapter,
)
from serving.api.core.errors import ApiError

UNAVAILABLE = "the adapter registry cannot be reached; try again"
log = logging.getLogger("loraserve.api")


def adapter_http_error(exc: AdapterError, not_found: str = "model_not_found") -> ApiError:
    """exc's answer: 404 (code not_found: a model named by a request, or an adapter managed),
    403 not its owner's, 409 a lost race for a name, 503 an unreachable registry, 500 a
    damaged record, else 400 (a malformed name or adapter, named by the adapters' check)."""
    if isinstance(exc, UnknownAdapter):
        return ApiError(404, str(exc), code=not_found)
    if isinstance(exc, NotOwner):
        return ApiError(403, str(exc), code="permission_denied")
    if isinstance(exc, NameConflict):
        return ApiError(409, str(exc), code="conflict")
    if isinstance(exc, RegistryUnavailable):
        return ApiError(503, UNAVAILABLE)
    if isinstance(exc, RegistryCorrupt):
        return _damaged(exc)
    return ApiError(400, str(exc))


async def registry_call(fn, *args, not_found: str = "adapter_not_found"):
    """fn(*args), blocking registry work, in a worker thread; its AdapterError as an answer."""
    try:
        return await run_in_threadpool(fn, *args)
    except AdapterError as exc:
        raise adapter_http_error(exc, not_found=not_found) from None


def _damaged(exc: RegistryCorrupt) -> ApiError:
    """The 500 of a damaged registry record: the log gets which one, the client no paths."""
    log.error("%s", exc)
    return ApiError(
        500, "the adapter registry holds a damaged record for this adapter; an operator can "
        "repair it by uploading the adapter again",
    )  # fmt: skip
