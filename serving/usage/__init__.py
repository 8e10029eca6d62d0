"""Tenants' usage and limits: metering in SQLite, exact per-minute rate limits, one facade."""

from serving.usage.store import UsageRecord, UsageStore, UsageStoreError

__all__ = ["UsageRecord", "UsageStore", "UsageStoreError"]
