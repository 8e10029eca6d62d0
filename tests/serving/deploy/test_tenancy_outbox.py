"""Usage a replica (or the Batch deployment's feeder) cannot hand to the Tenancy deployment is
kept in the machine's outbox and sent again, after the next record it takes, periodically,
and at start: each record arrives exactly once, even when a first delivery committed but its
answer was lost or came too late."""

import asyncio
import os
import stat
import time

import pytest

from serving.batch.records import Item, ItemResult
from serving.config import LimitsSection
from serving.deploy import tenancy as tenancy_module
from serving.deploy.batch_service import BatchService
from serving.deploy.tenancy import HandleTenancy, TenancyService
from serving.usage.outbox import OUTBOX_FILE, Outbox
from serving.usage.record import UsageRecord


class Method:
    """One method of the Tenancy's handle: .remote() calls the service in this process."""

    def __init__(self, tenancy: "FakeTenancy", name: str) -> None:
        self.tenancy, self.name = tenancy, name

    def remote(self, *args):
        async def call():
            await asyncio.sleep(0)
            down = self.tenancy.down
            if down == "refused":  # a restarting replica: the call never runs
                raise RuntimeError("the Tenancy's replica cannot be reached")
            if down == "slow":  # it commits, after the caller stopped waiting
                await asyncio.sleep(5 * tenancy_module.SEND_TIMEOUT_S)
            answer = getattr(self.tenancy.service, self.name)(*args)
            if down == "lost":  # it committed; its answer never came back
                raise RuntimeError("the Tenancy's answer was lost")
            return answer

        return call()


class FakeTenancy:
    """The Tenancy deployment's handle over a TenancyService in this process; `down` says
    how its calls fail."""

    def __init__(self, url: str) -> None:
        self.service = TenancyService(url, LimitsSection())
        self.down: str | None = None
        self.finish_many, self.record = Method(self, "finish_many"), Method(self, "record")

    def requests(self) -> int:
        return self.service.tenancy.store.totals()["interactive"]["requests"]


def record(tenant="acme", completion_tokens=5) -> UsageRecord:
    return UsageRecord(tenant, "k1", "base", "interactive", 10, 0, completion_tokens, time.time())


@pytest.fixture
def tenancy(tmp_path):
    fake = FakeTenancy(f"sqlite:///{tmp_path / 'usage.db'}")
    yield fake
    fake.service.tenancy.close()


@pytest.fixture
def outbox(tmp_path):
    return Outbox(str(tmp_path / "replica" / OUTBOX_FILE))


@pytest.fixture(autouse=True)
def _replica_folder(tmp_path):
    (tmp_path / "replica").mkdir()


async def until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_finishes_the_tenancy_refuses_are_kept_then_arrive_exactly_once(tenancy, outbox):
    async def main():
        client = HandleTenancy(tenancy, outbox, replay_s=3600)
        tenancy.down = "refused"
        for tokens in (1, 2, 3):
            await client.finish(None, record(completion_tokens=tokens), 0)  # no error
        assert tenancy.requests() == 0 and outbox.waiting()
        assert stat.S_IMODE(os.stat(outbox.path).st_mode) == 0o600
        tenancy.down = None
        await client.finish(None, record(completion_tokens=4), 0)  # taken, then the rest sent
        await until(lambda: not outbox.waiting())
        assert tenancy.requests() == 4
        totals = tenancy.service.tenancy.store.totals()["interactive"]
        assert totals["completion_tokens"] == 1 + 2 + 3 + 4
        assert await client.replay() == 0  # nothing left, nothing counted twice
        await client.finish(None, record(), 0)
        assert tenancy.requests() == 5
        client.close()

    asyncio.run(main())


@pytest.mark.parametrize("down", ["lost", "slow"])
def test_a_finish_that_committed_unanswered_is_counted_once(tenancy, outbox, down, monkeypatch):
    monkeypatch.setattr(tenancy_module, "SEND_TIMEOUT_S", 0.05)

    async def main():
        client = HandleTenancy(tenancy, outbox, replay_s=3600)
        tenancy.down = down
        await client.finish(None, record(), 0)
        await client.finish(None, record(tenant="globex"), 0)
        assert outbox.waiting()  # kept: the client cannot know they were taken
        await until(lambda: tenancy.requests() == 2)  # they were
        tenancy.down = None
        assert await client.replay() == 2  # sent again, counted once
        assert tenancy.requests() == 2 and not outbox.waiting()
        client.close()

    asyncio.run(main())


def test_a_restarted_replica_sends_what_the_last_run_kept(tenancy, outbox):
    async def before():
        client = HandleTenancy(tenancy, outbox, replay_s=3600)
        tenancy.down = "refused"
        await client.finish(None, record(), 0)
        await client.finish(None, record(), 0)
        client.close()

    async def after():  # no request: the replays start with the client
        client = HandleTenancy(tenancy, outbox, replay_s=0.05)
        await until(lambda: tenancy.requests() == 2 and not outbox.waiting())
        client.close()

    asyncio.run(before())
    assert tenancy.requests() == 0
    tenancy.down = None
    asyncio.run(after())
    assert tenancy.requests() == 2


def test_a_release_without_a_record_still_fails_as_before(tenancy, outbox):
    async def main():
        client = HandleTenancy(tenancy, outbox, replay_s=3600)
        tenancy.down = "refused"
        with pytest.raises(RuntimeError, match="cannot be reached"):
            await client.finish(None, None, 0)  # nothing to keep: the app logs it
        assert not outbox.waiting()
        client.close()

    asyncio.run(main())


def test_the_batch_feeders_usage_is_kept_beside_its_store_and_sent_once(tenancy, tmp_path):
    url = f"sqlite:///{tmp_path / 'batch' / 'batch.db'}"

    async def main():
        service = BatchService.__new__(BatchService)  # as Serve builds it: an async __init__
        await BatchService.__init__(service, url, max_in_flight=1, ttl_s=3600,
                                    server_name="ModelServer", app_name="app", tenancy=tenancy)  # fmt: skip
        item = Item("batch_x", 0, "acme", "k1", "demo", "/v1/completions", {"prompt": "hi"})
        used = ItemResult(200, {}, usage=record())
        try:
            tenancy.down = "refused"
            await service._meter(item, used)  # the item's committed result, metered
            kept = Outbox(str(tmp_path / "batch" / OUTBOX_FILE))
            assert kept.waiting() and tenancy.requests() == 0
            tenancy.down = None
            await service._meter(item, ItemResult(200, {}, usage=record()))
            await until(lambda: not kept.waiting())
            assert tenancy.requests() == 2
        finally:
            service.usage.close()
            await service.batch.stop()
            service.batch.store.close()

    asyncio.run(main())


def test_finishes_that_end_together_share_calls_and_each_counts_once(tenancy, outbox):
    """64 requests ending at once: a few finish_many calls carry them all (one at a time, each
    with what came meanwhile), every record counted once; a batch the Tenancy refuses goes to
    the outbox whole and arrives later, once."""
    calls = []
    real = tenancy.finish_many.remote
    tenancy.finish_many.remote = lambda items: calls.append(len(items)) or real(items)

    async def main():
        client = HandleTenancy(tenancy, outbox, replay_s=3600)
        await asyncio.gather(*(client.finish(None, record(completion_tokens=1), 0)
                               for _ in range(64)))  # fmt: skip
        assert sum(calls) == 64 and len(calls) < 8
        assert tenancy.requests() == 64
        tenancy.down = "refused"
        await asyncio.gather(*(client.finish(None, record(completion_tokens=2), 0)
                               for _ in range(16)))  # fmt: skip
        assert tenancy.requests() == 64 and outbox.waiting()
        tenancy.down = None
        await client.finish(None, record(completion_tokens=3), 0)
        await until(lambda: not outbox.waiting())
        totals = tenancy.service.tenancy.store.totals()["interactive"]
        assert totals["requests"] == 64 + 16 + 1
        assert totals["completion_tokens"] == 64 + 2 * 16 + 3
        client.close()

    asyncio.run(main())


def test_items_waiting_behind_a_stopped_call_are_failed_not_left_waiting():
    """The call carrying a batch is cancelled (the replica stops): its items and those queued
    behind it fail, so each sender keeps its record, rather than waiting for a call that will
    never come."""

    async def main():
        started = asyncio.Event()

        async def stuck(items):
            started.set()
            await asyncio.sleep(3600)

        batches = tenancy_module.Batches(stuck)
        first = asyncio.ensure_future(batches.send("a"))
        await started.wait()
        behind = asyncio.ensure_future(batches.send("b"))
        await asyncio.sleep(0)
        batches._running.cancel()
        for sender in (first, behind):
            with pytest.raises(RuntimeError, match="stopped"):
                await asyncio.wait_for(sender, 5)

    asyncio.run(main())
