"""A 50,000-request batch's results read over HTTP: every byte arrives, the read's memory
stays a few pages whatever the file's size, and other requests stay fast while it streams."""

import hashlib
import statistics
import threading
import time
import tracemalloc

import httpx
import pytest
from fastapi.responses import JSONResponse

from serving.api.batch.format import file_lines, output_file_ids
from serving.api.batch.local_store import LocalBatch
from serving.api.workers_ai.queued import workers_responses, workers_status
from serving.batch.records import OPENAI, WORKERS_AI
from serving.batch.store import BatchStore
from tests.serving.api.held import auth
from tests.serving.api.served import ACME, MODEL_ID, serve
from tests.serving.batch.finished_rows import finished_job

N = 50_000
pytestmark = pytest.mark.slow  # tens of MB rendered several times over


@pytest.fixture(scope="module")
def big(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("big-results")
    store = BatchStore(f"sqlite:///{root / 'batch.db'}")
    jobs = {api: finished_job(store, N, api=api, failed_every=97) for api in (OPENAI, WORKERS_AI)}
    with serve(world, root, batch=LocalBatch(store, max_in_flight=1, ttl_s=3600)) as served:
        yield served, store, jobs
    store.close()


def read(method: str, url: str, **kwargs) -> tuple[int, str]:
    """(size, sha256) of the answer's body, read as it arrives and never held whole."""
    digest, size = hashlib.sha256(), 0
    with httpx.stream(method, url, headers=auth(ACME), timeout=120, **kwargs) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def healthz_latencies(url: str, busy: threading.Thread | None = None, n: int = 40):
    """/healthz's latencies: n of them, or as many as fit while busy runs."""
    latencies = []
    with httpx.Client(timeout=60) as probe:
        while busy.is_alive() if busy else len(latencies) < n:
            t0 = time.perf_counter()
            assert probe.get(url + "/healthz").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.005)
    return latencies


def test_a_50k_output_file_streams_in_flat_memory_while_other_requests_stay_fast(big):
    served, store, jobs = big
    job = jobs[OPENAI]
    whole = file_lines(job, store.results("acme", job.id), errors=False)
    expected = len(whole), hashlib.sha256(whole).hexdigest()
    del whole
    url = f"{served.url}/v1/files/{output_file_ids(job)[0]}/content"
    assert expected[0] > 20 * 2**20  # the file, were it held whole

    answer = {}
    reader = threading.Thread(target=lambda: answer.update(got=read("GET", url)))
    idle = healthz_latencies(served.url)
    reader.start()
    during = healthz_latencies(served.url, busy=reader)
    reader.join()
    assert answer["got"] == expected
    # Rendered whole on the loop, the file held it for seconds at a stretch (a probe or two
    # that long among many fast ones); streamed, the loop only waits its turn for the GIL
    # with the page being rendered. Generous bounds, relative to the idle median.
    assert len(during) >= 5, during
    typical = statistics.median(idle)
    assert statistics.median(during) < 10 * typical + 0.01, (idle, during)
    assert max(during) < 200 * typical + 0.25, (idle, during)

    tracemalloc.start()  # the server runs in this process: its allocations are counted
    try:
        base = tracemalloc.get_traced_memory()[0]
        got = read("GET", url)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert got == expected
    assert peak < 8 * 2**20, peak  # a few pages in flight, never the 20+ MB file


def test_a_50k_workers_poll_streams_valid_json_with_the_bytes_it_had_whole(big):
    served, store, jobs = big
    job = jobs[WORKERS_AI]
    result = workers_status(job, workers_responses(store.results("acme", job.id)))
    whole = {"result": result, "success": True, "errors": [], "messages": []}
    expected = JSONResponse(whole).body
    with httpx.Client(timeout=120) as c:
        r = c.post(f"{served.url}/ai/run/{MODEL_ID}", json={"request_id": job.id},
                   headers=auth(ACME))  # fmt: skip
    assert r.status_code == 200 and "content-length" not in r.headers
    assert r.content == expected
    result = r.json()["result"]
    assert result["status"] == "done" and len(result["responses"]) == N
    assert [x["id"] for x in result["responses"]] == list(range(N))
    assert sum(not x["success"] for x in result["responses"]) == job.failed == N // 97
