"""The mark of a queued item in flight through the app: its request's scope carries a
QueuedCall, which tells generation.start to run it at the scheduler's batch priority, without
rate-limit admission, and to leave its usage record here for the feeder to meter once the
item's result is committed (serving.api.batch.items runs the items)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from serving.usage.record import UsageRecord

QUEUED_CALL = "loraserve.queued_call"  # where a queued item's QueuedCall sits in scope["state"]


@dataclass
class QueuedCall:
    """A queued item in flight through the app; the route leaves its usage record here."""

    record: UsageRecord | None = None


def queued_call(request: Request) -> QueuedCall | None:
    """The QueuedCall of a request that is a queued item, None for a client's own request."""
    return request.scope.get("state", {}).get(QUEUED_CALL)
