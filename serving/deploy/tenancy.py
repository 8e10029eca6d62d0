"""One Tenancy for every replica: tenants' rate limits and the usage store, as a deployment.

Limits must hold however many replicas serve HTTP, so their counters live in one place: a
single-replica deployment (`num_cpus: 0`) that owns the limiter and writes the usage store
(usage.store, a SQLite file on the head node, where it runs). Each ModelServer's app reaches it
through HandleTenancy, the serving.api TenancyClient over a deployment handle: one call to
admit a request (only for a tenant with a rate limit), and one to record it when it ends,
shared with the requests that end while the call before it runs (Batches): a call through
a handle costs the replica milliseconds of the cores its engine runs on.
A limit that refuses a request comes back as a value, not an exception, so the refusal
crosses Ray exactly as it was made. A record the Tenancy does not take in SEND_TIMEOUT_S (or
refuses: it is restarting) is kept in this machine's outbox (serving.usage.outbox) and sent
again, each with an id its store counts once, after the next record it takes and every
REPLAY_S, from the start: no usage is dropped for a Tenancy that could not be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence

from ray.serve.handle import DeploymentHandle

from serving.api.core.metering import TENANCY_TIMEOUT_S
from serving.config import LimitsSection
from serving.deploy.head_node import on_head_node
from serving.usage.limits import Admission, RateLimited
from serving.usage.outbox import Outbox, with_id
from serving.usage.record import UsageRecord
from serving.usage.service import Tenancy, limits_from_config
from serving.usage.store import UsageStore

# A record not taken in this long is kept in the outbox: before the app stops waiting for it
SEND_TIMEOUT_S = TENANCY_TIMEOUT_S / 2
REPLAY_S = 30.0  # how often the outbox is looked at for records waiting (after the start)
REPLAY_CHUNK = 1000  # records per call of a replay
log = logging.getLogger("loraserve.usage")


class TenancyService:
    """The deployment's replica: one Tenancy over the configured store and limits."""

    def __init__(self, store_url: str, limits: LimitsSection) -> None:
        self.tenancy = Tenancy(UsageStore(store_url), limits_from_config(limits))

    def admit(self, tenant: str, tokens: int) -> Admission | tuple:
        try:
            return self.tenancy.admit(tenant, tokens)
        except RateLimited as exc:
            return ("limited", exc.limit, str(exc), exc.retry_after_s, tuple(exc.headers))

    def finish_many(self, items: Sequence[tuple]) -> None:
        """Tenancy.finish of each (admission, record, tokens_used) a replica batched."""
        self.tenancy.finish_many(items)

    def record(self, records: Sequence[UsageRecord]) -> None:
        self.tenancy.record(records)

    def usage(self, query: dict) -> list[dict]:
        return self.tenancy.usage(**query)

    def window(self, tenant: str) -> dict[str, int | None]:
        return self.tenancy.window(tenant)

    def __del__(self):
        tenancy = getattr(self, "tenancy", None)
        if tenancy is not None:
            tenancy.close()


TenancyServer = on_head_node("Tenancy")(TenancyService)


class HandleTenancy:
    """serving.api's TenancyClient over the Tenancy deployment's handle; the records it cannot
    hand over are kept in outbox (None: only logged) and sent again until they are taken."""

    def __init__(
        self, handle: DeploymentHandle, outbox: Outbox | None = None, *,
        replay_s: float = REPLAY_S,
    ) -> None:  # fmt: skip
        self.handle, self.outbox, self.replay_s = handle, outbox, replay_s
        self._finishes = Batches(lambda items: _within(self.handle.finish_many.remote(items)))
        self._owed = outbox is not None  # a previous run's records may wait: sent at start
        self._replay: asyncio.Task | None = None
        self._replays: asyncio.Task | None = None
        with contextlib.suppress(RuntimeError):  # no loop yet: replays start with a finish
            self._start_replays()

    async def admit(self, tenant: str, tokens: int) -> Admission:
        answer = await self.handle.admit.remote(tenant, tokens)
        if isinstance(answer, tuple):
            _, limit, message, retry_after_s, headers = answer
            raise RateLimited(limit, message, retry_after_s, headers)
        return answer

    async def finish(
        self, admission: Admission | None, record: UsageRecord | None, tokens_used: int
    ) -> None:
        # Made outside the request's context: Serve cancels the calls a request has in flight
        # when it cancels the request (its client left), and this one, the request's usage
        # record and its admission's release, is made just then for a client that left.
        call = self._finish(admission, record, tokens_used)
        task = asyncio.get_running_loop().create_task(call, context=contextvars.Context())
        await asyncio.shield(task)

    async def _finish(self, admission, record: UsageRecord | None, tokens_used: int) -> None:
        self._start_replays()
        if record is not None and self.outbox is not None:
            record = with_id(record)  # it may be sent twice: the store counts its id once
        try:
            await self._finishes.send((admission, record, tokens_used))
        except Exception as exc:
            if record is None or self.outbox is None:
                raise
            await asyncio.to_thread(self.outbox.keep, [record])  # OSError: lost, the app logs
            self._owed = True
            log.warning("the Tenancy did not take a %s request's usage (%s); kept in %s to send "
                        "again", record.tenant, type(exc).__name__, self.outbox.path)  # fmt: skip
            return
        if self._owed:
            self._replay_soon()

    async def replay(self) -> int:
        """Send the records the outbox keeps, oldest first; how many. Raises what stopped it
        (the Tenancy still unreachable): the records not known taken are sent again later."""
        if self.outbox is None:
            return 0
        self._owed = False  # before the take: a record kept during the replay owes another
        sent = 0
        try:
            for path, records in await asyncio.to_thread(self.outbox.take):
                for start in range(0, len(records), REPLAY_CHUNK):
                    await _within(self.handle.record.remote(records[start : start + REPLAY_CHUNK]))
                await asyncio.to_thread(self.outbox.sent, path)
                sent += len(records)
        except BaseException:
            self._owed = True
            raise
        if sent:
            log.warning("%d usage record(s) kept in %s reached the Tenancy", sent, self.outbox.path)
        return sent

    def close(self) -> None:
        """Stop replaying (what waits stays in the outbox for the next start)."""
        for task in (self._replays, self._replay):
            if task is not None:
                task.cancel()

    def _replay_soon(self) -> asyncio.Task:
        """The replay running in this process, started now if none is."""
        if self._replay is None or self._replay.done():
            loop = asyncio.get_running_loop()
            self._replay = loop.create_task(self.replay(), context=contextvars.Context())
            self._replay.add_done_callback(self._replayed)
        return self._replay

    def _replayed(self, replay: asyncio.Task) -> None:
        if not replay.cancelled() and replay.exception() is not None:
            log.warning("usage kept in %s cannot reach the Tenancy yet: %r", self.outbox.path,
                        replay.exception())  # fmt: skip

    def _start_replays(self) -> None:
        """Replay every replay_s on the running loop (RuntimeError if none), once."""
        if self.outbox is not None and self._replays is None:
            loop = asyncio.get_running_loop()
            self._replays = loop.create_task(self._replay_every(), context=contextvars.Context())

    async def _replay_every(self) -> None:
        while True:
            if self._owed or await asyncio.to_thread(self.outbox.waiting):
                with contextlib.suppress(Exception):  # logged by _replayed
                    await asyncio.shield(self._replay_soon())
            await asyncio.sleep(self.replay_s)

    async def usage(self, **query) -> list[dict]:
        return await self.handle.usage.remote(query)

    async def window(self, tenant: str) -> dict[str, int | None]:
        return await self.handle.window.remote(tenant)


class Batches:
    """Items sent through call(list) in batches: one call at a time, each carrying every item
    that came while the one before ran, so an idle sender's item goes at once and a busy
    one's calls grow rather than multiply. send() returns, or raises, as its call did."""

    def __init__(self, call: Callable[[list], Awaitable]) -> None:
        self.call = call
        self._queued: list[tuple[object, asyncio.Future]] = []
        self._running: asyncio.Task | None = None

    async def send(self, item) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.create_future()
        self._queued.append((item, sent))
        if self._running is None or self._running.done():
            # Outside the sender's context, as its own call was: a cancelled request's
            # cancellation must not reach a call that carries others' items too.
            self._running = loop.create_task(self._drain(), context=contextvars.Context())
        await asyncio.shield(sent)

    async def _drain(self) -> None:
        while self._queued:
            batch, self._queued = self._queued, []
            try:
                await self.call([item for item, _ in batch])
            except BaseException as exc:  # each sender handles its own (the outbox keeps it)
                stopped = not isinstance(exc, Exception)  # cancelled: no call carries the rest
                failure = RuntimeError(f"the call was stopped: {exc!r}") if stopped else exc
                for _, sent in batch + (self._queued if stopped else []):
                    if not sent.done():
                        sent.set_exception(failure)
                if stopped:
                    self._queued = []
                    raise
            else:
                for _, sent in batch:
                    if not sent.done():
                        sent.set_result(None)


async def _within(call: Awaitable):
    """call's answer, waited for SEND_TIMEOUT_S at most; past it the call goes on (it may still
    commit: the ids of the records it carries keep them from being counted twice)."""
    running = asyncio.ensure_future(call)
    running.add_done_callback(_logged)
    return await asyncio.wait_for(asyncio.shield(running), SEND_TIMEOUT_S)


def _logged(done: asyncio.Future) -> None:
    """Retrieve a call's failure, so that asyncio does not warn of one its caller gave up on."""
    if not done.cancelled() and done.exception() is not None:
        log.debug("a call to the Tenancy failed: %r", done.exception())
