"""Tenancy: the one object the HTTP layer talks to for tenants' limits and usage.

It admits requests under each tenant's limits and, when a request ends, frees its place and
records what it used. Plain Python and thread-safe: one process holds it directly, or a
shared actor holds one for every replica, so limits hold across replicas. finish() writes
the usage in SQLite and returns once it is committed, so callers run it in a worker thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from serving.config import LimitsSection
from serving.usage.limits import RATE_LIMITS, RUNNING_TTL_S, Admission, Limiter, Limits
from serving.usage.record import UsageRecord
from serving.usage.store import UsageStore

log = logging.getLogger("loraserve.usage")


class Tenancy:
    """A Limiter and a UsageStore behind one door; no store = usage is not kept."""

    def __init__(
        self,
        store: UsageStore | None,
        limits_of: Callable[[str], Limits],
        clock: Callable[[], float] = time.monotonic,
        running_ttl_s: float = RUNNING_TTL_S,
    ) -> None:
        self.store = store
        self.limiter = Limiter(limits_of, clock, running_ttl_s)

    def admit(self, tenant: str, tokens: int) -> Admission:
        """Admit a request reserving `tokens` (prompt + max_tokens); raises RateLimited."""
        return self.limiter.admit(tenant, tokens)

    def finish(
        self,
        admission: Admission | None,
        record: UsageRecord | None,
        tokens_used: int | None = None,
    ) -> None:
        """Free the admission (if any), charging tokens_used (default: the record's prompt and
        completion tokens); record the record (if any), committed, or spooled for replay when
        the store fails (UsageStore.record).

        A request that never reached the engine has no record: its admission is charged 0. A
        request that failed has tokens it used but no record (it is not billed).
        One finished past the limiter's running TTL frees nothing (its place was given away
        already) but its record is still kept.
        """
        self.finish_many([(admission, record, tokens_used)])

    def finish_many(
        self, items: Sequence[tuple[Admission | None, UsageRecord | None, int | None]]
    ) -> None:
        """finish() of each (admission, record, tokens_used), the records in one write; an
        admission that cannot be released is logged, and holds up neither the others nor the
        records."""
        for admission, record, tokens_used in items:
            if admission is not None:
                used = tokens_used
                if used is None:
                    used = record.prompt_tokens + record.completion_tokens if record else 0
                # Freed before the write, so a failing disk never holds a tenant's place.
                try:
                    self.limiter.finish(admission, used)
                except Exception:
                    log.exception("a %s admission was not released", admission.tenant)
        records = [record for _, record, _ in items if record is not None]
        if records and self.store is not None:
            self.store.record(records)

    def record(self, records: Sequence[UsageRecord]) -> None:
        """Record records sent again (a replica's outbox), each counted once by its id;
        committed, or spooled as finish() does."""
        if records and self.store is not None:
            self.store.record(records)

    def usage(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        group_by: str = "adapter",
        tenant: str | None = None,
    ) -> list[dict]:
        """Usage rows (UsageStore.query); none when usage is not kept."""
        if self.store is None:
            return []
        return self.store.query(start=start, end=end, group_by=group_by, tenant=tenant)

    def window(self, tenant: str) -> dict[str, int | None]:
        """What tenant's rate limits count over the sliding 60 s (Limiter.window): exact,
        where the store keeps whole minutes."""
        return self.limiter.window(tenant)

    def close(self) -> None:
        """Close the store; requests admitted but unfinished are simply forgotten."""
        if self.store is not None:
            self.store.close()


def limits_from_config(section: LimitsSection) -> Callable[[str], Limits]:
    """tenant -> its rate Limits under the config's `limits:` (overrides, else defaults)."""
    default = Limits(**{key: getattr(section, key) for key in RATE_LIMITS})
    named = {name: _rates(section.for_tenant(name)) for name in section.tenants}
    return lambda tenant: named.get(tenant, default)


def _rates(limits: dict[str, int | None]) -> Limits:
    return Limits(**{key: limits[key] for key in RATE_LIMITS})
