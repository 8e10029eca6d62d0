"""The Batch deployment's handle: every call the routes make of a batch client, and the
replica's refusals passed on as they were raised."""

import asyncio
import inspect

import pytest
from ray.exceptions import RayError, RayTaskError

from serving.api.batch.local_store import LocalBatch
from serving.api.core.batch_store import BatchClient
from serving.api.core.errors import ApiError
from serving.api.core.quotas import queue_full
from serving.batch.store import BatchQueueFull
from serving.deploy.batch_service import HandleBatch


def _calls(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and name[0] != "_"}


def test_the_handle_and_the_local_client_have_every_call_of_the_protocol():
    calls = _calls(BatchClient)
    assert calls <= _calls(HandleBatch) and calls <= _calls(LocalBatch)
    # submit has its own remote method; the rest go through BatchService.call's allow-list
    assert calls - {"submit"} == set(HandleBatch.FORWARDED)
    for name in calls:
        assert inspect.iscoroutinefunction(getattr(HandleBatch, name)), name
        handle, protocol = (inspect.signature(getattr(c, name)) for c in (HandleBatch, BatchClient))
        if name != "submit":  # **job there: the store checks the keywords
            assert list(handle.parameters) == list(protocol.parameters), name


def test_a_refusal_raised_in_the_batch_deployment_reaches_the_route_as_itself():
    """A batch_queue_full 429 raised in the Batch replica crosses Ray's error serialization
    (as a task error does between processes) and the handle raises it unchanged, not as the
    503 of an unreachable store."""
    refusal = queue_full(BatchQueueFull(3, 3, 1))
    crossed = RayError.from_bytes(RayTaskError("submit", "traceback", refusal).to_bytes())

    async def answer():
        raise crossed

    with pytest.raises(ApiError) as raised:
        asyncio.run(HandleBatch._reach(answer()))
    got = raised.value
    assert (got.status, got.code, got.message, got.headers) == (
        429,
        "batch_queue_full",
        refusal.message,
        {},
    )
