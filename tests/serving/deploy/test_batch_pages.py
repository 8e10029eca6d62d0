"""Batch results across the Batch deployment's handle: an app whose store is a Batch replica
reads output files, uploaded files and Workers-AI polls one bounded page (or chunk) per call,
and sends the same bytes as the whole answers."""

import shutil
import tempfile

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.batch.format import file_lines, output_file_ids
from serving.api.workers_ai.queued import workers_responses, workers_status
from serving.batch.files import CHUNK_BYTES
from serving.batch.records import OPENAI, WORKERS_AI
from serving.batch.results import PAGE_ITEMS
from serving.batch.store import BatchStore
from serving.deploy.batch_service import BatchServer, HandleBatch
from tests.serving.api.held import Held, auth
from tests.serving.api.served import ACME, MODEL_ID, chat_world, stub_settings
from tests.serving.batch.finished_rows import finished_job

N = 3 * PAGE_ITEMS + 11
pytestmark = pytest.mark.slow  # a Ray of its own


class Counted(HandleBatch):
    """HandleBatch, noting the method of every call that crosses to the Batch replica."""

    def __init__(self, handle):
        super().__init__(handle)
        self.calls: list[str] = []

    async def _call(self, method, *args, **kwargs):
        self.calls.append(method)
        return await super()._call(method, *args, **kwargs)


@pytest.fixture(scope="module")
def over_ray(tmp_path_factory):
    import ray
    from ray import serve

    root = tmp_path_factory.mktemp("batch-pages")
    url = f"sqlite:///{root / 'batch.db'}"
    store = BatchStore(url)  # rows written here; the replica opens the same file
    jobs = {api: finished_job(store, N, api=api, failed_every=5) for api in (OPENAI, WORKERS_AI)}
    ray_dir = tempfile.mkdtemp(prefix="lsbp-")  # short: Ray's socket paths must fit 107 bytes
    with pytest.MonkeyPatch.context() as env:  # Ray's processes inherit these
        env.setenv("HOME", str(root))
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=1, include_dashboard=False, _temp_dir=ray_dir)
        try:
            serve.start(proxy_location="Disabled")
            app = BatchServer.bind(url, max_in_flight=1, ttl_s=3600, server_name="ModelServer",
                                   app_name="none")  # fmt: skip
            handle = serve.run(app, name="batch-pages", route_prefix=None)
            batch = Counted(handle)
            api = create_app(Held(), stub_settings(chat_world(root / "world"), root), batch=batch)
            with TestClient(api, raise_server_exceptions=False) as client:
                yield client, batch, store, jobs
        finally:
            serve.shutdown()
            ray.shutdown()
            store.close()
            shutil.rmtree(ray_dir, ignore_errors=True)


def test_an_output_file_crosses_the_handle_a_page_per_call(over_ray):
    client, batch, store, jobs = over_ray
    job = jobs[OPENAI]
    batch.calls.clear()
    r = client.get(f"/v1/files/{output_file_ids(job)[0]}/content", headers=auth(ACME))
    assert r.status_code == 200, r.text
    assert r.content == file_lines(job, store.results("acme", job.id), errors=False)
    pages = -(-N // PAGE_ITEMS)
    assert batch.calls == ["file", "job"] + ["results_page"] * (pages + 1)  # the last: []


def test_a_workers_poll_crosses_the_handle_a_page_per_call(over_ray):
    client, batch, store, jobs = over_ray
    job = jobs[WORKERS_AI]
    batch.calls.clear()
    r = client.post(f"/ai/run/{MODEL_ID}", json={"request_id": job.id}, headers=auth(ACME))
    result = workers_status(job, workers_responses(store.results("acme", job.id)))
    whole = {"result": result, "success": True, "errors": [], "messages": []}
    assert r.status_code == 200 and r.content == JSONResponse(whole).body
    assert batch.calls == ["job"] + ["results_page"] * (-(-N // PAGE_ITEMS) + 1)


def test_an_uploaded_file_crosses_the_handle_a_chunk_per_call(over_ray):
    client, batch, store, _ = over_ray
    line = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    content = line * (2 * CHUNK_BYTES // len(line) + 5)
    f = store.add_file("acme", "batch", "in.jsonl", content)
    batch.calls.clear()
    r = client.get(f"/v1/files/{f.id}/content", headers=auth(ACME))
    assert r.status_code == 200 and r.content == content
    assert batch.calls == ["file"] + ["file_chunk"] * 4  # three chunks, then b""
