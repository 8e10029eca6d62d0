"""An ended batch's output and error files report the bytes their content streams, counted at
the first read of their metadata and kept by the store, so later reads render nothing."""

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.batch.local_store import LocalBatch
from serving.batch.records import NewItem
from serving.batch.results import PAGE_ITEMS
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, stub_settings
from tests.serving.batch.finished_rows import finished_job


class Paged(LocalBatch):
    """LocalBatch, counting the result pages read through it."""

    pages = 0

    async def results_page(self, tenant, job_id, after):
        self.pages += 1
        return await super().results_page(tenant, job_id, after)


@pytest.fixture
def served(world, tmp_path, store):
    batch = Paged(store, max_in_flight=1, ttl_s=3600)
    app = create_app(Held(), stub_settings(world, tmp_path), batch=batch)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, batch


@pytest.mark.parametrize("cancelled", [False, True], ids=["finished", "cancelled"])
@pytest.mark.parametrize("errors", [False, True], ids=["output", "errors"])
def test_a_files_bytes_equal_its_content_and_are_counted_once(served, store, cancelled, errors):
    client, batch = served
    n = 2 * PAGE_ITEMS + 5
    job = finished_job(store, n, failed_every=6, cancelled_from=PAGE_ITEMS if cancelled else None)
    listed = client.get(f"/v1/batches/{job.id}", headers=auth(ACME)).json()
    assert listed["status"] == ("cancelled" if cancelled else "completed")
    file_id = listed["error_file_id" if errors else "output_file_id"]

    first = client.get(f"/v1/files/{file_id}", headers=auth(ACME))
    assert first.status_code == 200 and batch.pages > 0  # counted, a page at a time
    kept = store.job("acme", job.id)
    assert (kept.error_bytes if errors else kept.output_bytes) == first.json()["bytes"]

    batch.pages = 0
    again = client.get(f"/v1/files/{file_id}", headers=auth(ACME))
    assert again.json() == first.json() and batch.pages == 0  # nothing rendered again
    content = client.get(f"/v1/files/{file_id}/content", headers=auth(ACME))
    assert content.status_code == 200 and len(content.content) == first.json()["bytes"] > 0
    assert content.headers["content-length"] == str(len(content.content))


def test_no_size_is_kept_for_a_job_still_running(store):
    job = store.submit(tenant="acme", key_id="k", model="demo", api="openai",
                       endpoint="/v1/completions", items=[NewItem({"prompt": "hi"})])  # fmt: skip
    store.keep_results_bytes("acme", job.id, False, 10)
    store.keep_results_bytes("globex", job.id, False, 10)  # another tenant's id: nothing
    assert store.job("acme", job.id).output_bytes is None
