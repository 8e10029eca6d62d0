"""What one request used, as the usage store counts it: a UsageRecord and its minute.

A record is what a replica's outbox sends (serving.usage.outbox) and what the store adds
to its row of (minute, tenant, key_id, adapter, kind) (serving.usage.store). Its counts
are checked where it is made, so a bad one is refused before it travels.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("interactive", "batch")
COUNTS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")


@dataclass(frozen=True)
class UsageRecord:
    """What one request (or several, with requests > 1) used, ended at `time`."""

    tenant: str
    key_id: str  # a key's public id, never the key itself
    adapter: str  # "base" or the adapter's label "tenant/name"
    kind: str  # "interactive" | "batch"
    prompt_tokens: int  # cached_tokens included, as in OpenAI's usage
    cached_tokens: int
    completion_tokens: int
    time: float  # epoch seconds when the request ended
    requests: int = 1
    # Set where it may be sent twice (a replica's outbox): the store counts it once per id.
    id: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"usage kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in COUNTS:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"usage {name} must be an integer >= 0, got {value!r}")


def empty_counts() -> dict[str, int]:
    """Zero requests and tokens: the counts of one kind in a usage row."""
    return dict.fromkeys(COUNTS, 0)


def minute_of(seconds: float) -> int:
    """The start (epoch seconds) of the minute that holds `seconds`: its usage row's minute."""
    return int(seconds // 60) * 60
