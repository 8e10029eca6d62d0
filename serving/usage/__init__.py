"""Tenants' usage and limits: metering in SQLite, exact per-minute rate limits, one facade."""

from serving.usage.limits import Admission, Limiter, Limits, RateLimited
from serving.usage.record import UsageRecord
from serving.usage.service import Tenancy, limits_from_config
from serving.usage.store import UsageStore, UsageStoreError

__all__ = [
    "Admission",
    "Limiter",
    "Limits",
    "RateLimited",
    "Tenancy",
    "UsageRecord",
    "UsageStore",
    "UsageStoreError",
    "limits_from_config",
]
