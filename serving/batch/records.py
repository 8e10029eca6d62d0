"""What the batch store holds and hands out: plain frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

# The APIs a job came through; each renders the same items in its own shape.
WORKERS_AI, OPENAI = "workers-ai", "openai"
# The bodies an item may carry: a Workers-AI body, or an OpenAI body for one of its URLs.
ENDPOINTS = ("/ai/run", "/v1/chat/completions", "/v1/completions", "/v1/responses")
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
EXPIRED = "expired"  # an item still queued when its job's completion window ended
# OpenAI's one completion window: a batch's requests not begun within it are dropped
COMPLETION_WINDOW_S = 24 * 3600


@dataclass(frozen=True)
class NewItem:
    """One request of a job being submitted: its body, and the caller's reference for it."""

    body: dict
    ref: str | None = None  # Workers AI's external_reference, OpenAI's custom_id


@dataclass(frozen=True)
class Item:
    """One queued request, as the feeder runs it: who sent it, for which model, and how."""

    job_id: str
    index: int  # its place in the job, from 0
    tenant: str
    key_id: str
    model: str
    endpoint: str  # one of ENDPOINTS
    body: dict
    ref: str | None = None
    attempt: int = 1  # this run's number: a transient failure is retried a few times


@dataclass(frozen=True)
class ItemResult:
    """How one item ended: status 200 with the endpoint's answer, or an error status and
    message; the token counts are what it used, zero when it never ran."""

    status: int
    body: dict | None = None  # the endpoint's JSON answer (on failure: its error answer, if any)
    error: str | None = None  # the message, on failure
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # What to meter once the result is committed (serving.usage's UsageRecord); not stored.
    usage: object = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def transient(self) -> bool:
        """A failure the item is not to blame for (a full queue, a lost replica, a store
        that could not be reached): worth running again."""
        return self.status in (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class ItemRecord:
    """One item of a finished (or running) job, as its results show it."""

    index: int
    ref: str | None
    state: str  # queued | running | done | failed | cancelled | expired
    result: ItemResult | None


@dataclass(frozen=True)
class Job:
    """A submitted batch and its progress; times are epoch seconds, None until they happen."""

    id: str
    tenant: str
    model: str
    api: str  # WORKERS_AI | OPENAI
    endpoint: str
    total: int
    completed: int  # items that succeeded
    failed: int  # items that failed (their errors are in the results)
    created: float
    started: float | None = None  # the first item was taken
    finished: float | None = None  # every item ended, or cancelled ones were dropped
    cancelling: float | None = None  # cancel was asked
    input_file_id: str | None = None
    metadata: dict = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    expired: float | None = None  # the completion window ended with items still queued
    # Its output and error files' sizes, kept once measured: they never change once it ended
    output_bytes: int | None = None
    error_bytes: int | None = None

    @property
    def dropped(self) -> int:
        """Items that never ran: dropped by a cancel, or by the end of the window."""
        return self.total - self.completed - self.failed if self.finished else 0

    @property
    def state(self) -> str:
        """queued | running | done | cancelling | cancelled | expired (once the items running
        when the window ended have finished)."""
        if self.cancelling is not None:
            return CANCELLED if self.finished is not None else "cancelling"
        if self.expired is not None:
            return EXPIRED if self.finished is not None else RUNNING
        if self.finished is not None:
            return "done"
        return RUNNING if self.started is not None else QUEUED


@dataclass(frozen=True)
class StoredFile:
    """An uploaded file (OpenAI's Files API), without its content."""

    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created: float


@dataclass(frozen=True)
class BatchHoldings:
    """What a tenant's batch quotas count: files kept, their bytes, requests not yet ended."""

    files: int
    file_bytes: int
    pending: int
