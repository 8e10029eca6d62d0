"""An OpenAI batch still running when its 24h completion window ends, through the `openai`
client: it ends `expired`; what finished is in the output file, every request that never
ran is an error line `batch_expired`, and nothing more runs."""

import time

import pytest

from serving.api.batch.format import openai_batch
from serving.api.batch.local_store import memory_batch
from serving.batch.records import OPENAI, WORKERS_AI, Job
from tests.serving.api.served import serve
from tests.serving.batch.openai_batch import (
    MODELS,
    chat,
    client,
    line,
    read,
    slowed,
    start,
    until_completed,
    wait,
)


@pytest.fixture(scope="module")
def local_batch():
    return memory_batch()


@pytest.fixture(scope="module")
def served(world, tmp_path_factory, local_batch):
    with serve(world, tmp_path_factory.mktemp("batch-expiry"), batch=local_batch) as s:
        yield s


@pytest.mark.slow
def test_a_batch_past_its_window_expires_keeping_what_finished(served, local_batch):
    c = client(served)
    with slowed(served):
        batch = start(c, [line(f"e{i}", chat(MODELS[i % 4], i, max_tokens=4)) for i in range(60)])
        until_completed(c, batch.id, 2)
        # The feeder's sweep as it runs 24 h after the submit (it sweeps every 10 minutes).
        assert local_batch.store.close_overdue(24 * 3600, now=batch.created_at + 24 * 3600 + 1)
        done = wait(c, batch.id)
    counts = done.request_counts
    assert done.status == "expired" and done.expired_at == batch.created_at + 24 * 3600 + 1
    assert done.completed_at is None and done.cancelled_at is None
    assert counts.failed == 0 and 2 <= counts.completed < counts.total == 60
    outputs = read(c, done.output_file_id)
    assert len(outputs) == counts.completed
    never = read(c, done.error_file_id)
    assert {x["error"]["code"] for x in never} == {"batch_expired"}
    assert all(x["response"] is None for x in never)
    assert sorted(x["custom_id"] for x in outputs + never) == sorted(f"e{i}" for i in range(60))
    time.sleep(1.0)
    assert c.batches.retrieve(batch.id).request_counts == counts
    assert not served.generator.engine.scheduler.has_work()


@pytest.mark.parametrize("api, expires", [(OPENAI, 1000.0 + 24 * 3600), (WORKERS_AI, None)])
def test_only_an_openai_batch_has_a_window_to_expire_at(api, expires):
    """A Workers-AI queued job, listed by /v1/batches too, never expires: no expires_at."""
    job = Job("batch_x", "acme", "demo", api, "/v1/chat/completions", 1, 0, 0, created=1000.0)
    batch = openai_batch(job)
    assert batch["expires_at"] == expires
    assert batch["completion_window"] == ("24h" if expires else None)
