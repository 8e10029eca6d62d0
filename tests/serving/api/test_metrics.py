"""/metrics: Prometheus text that parses, request counters and latencies that move, engine
gauges per replica, and an adapter label set that stays bounded."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.api.metrics import AdapterLabels, Metrics
from serving.engine.figures import EngineFigures
from tests.serving.api.served import ACME, MODEL_ID, serve

AUTH = {"Authorization": f"Bearer {ACME}"}


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("metrics")) as s:
        yield s


def scrape(served) -> dict[tuple[str, tuple], float]:
    r = httpx.get(served.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_move(served):
    before = scrape(served)
    for model in ("upper", MODEL_ID, "upper"):
        body = {"model": model, "prompt": "count me", "max_tokens": 3, "temperature": 0}
        r = httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200
    after = scrape(served)
    for label, n in (("upper", 2), ("base", 1)):
        assert value(after, "loraserve_time_to_first_token_seconds_count", adapter=label) == (
            value(before, "loraserve_time_to_first_token_seconds_count", adapter=label) + n
        )
        assert value(after, "loraserve_e2e_request_latency_seconds_count", adapter=label) == (
            value(before, "loraserve_e2e_request_latency_seconds_count", adapter=label) + n
        )
        prompt = value(after, "loraserve_prompt_tokens_total", adapter=label) - value(
            before, "loraserve_prompt_tokens_total", adapter=label
        )
        assert prompt == n * len(served.text_ids("count me"))
        generated = value(after, "loraserve_generation_tokens_total", adapter=label) - value(
            before, "loraserve_generation_tokens_total", adapter=label
        )
        assert 0 < generated <= 3 * n
    ok = sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k[0] == "loraserve_requests_total" and dict(k[1])["status"] == "200"
    )
    assert ok == 3
    assert value(after, "loraserve_num_requests_running", replica="local") == 0
    assert value(after, "loraserve_adapter_loads_total", replica="local") >= 1
    assert 0 < value(after, "loraserve_adapter_slab_occupancy_ratio", replica="local") <= 1
    assert value(after, "loraserve_prefix_cache_queried_tokens_total", replica="local") > 0


def test_adapter_labels_are_bounded():
    label = AdapterLabels(max_labels=2)
    assert [label(v) for v in ("a@1", "b@2", "c@3", "a@4", None)] == [
        "a",
        "b",
        "other",
        "a",
        "base",
    ]


def test_engine_figures_render_per_replica_and_adapter():
    metrics = Metrics()
    figures = [
        EngineFigures(
            replica=f"r{i}",
            num_running=i,
            num_waiting=2,
            kv_usage=0.5,
            prefix_cache_hit_rate=0.25,
            prefix_queried_tokens=8,
            prefix_hit_tokens=2,
            num_preemptions=1,
            spec={"upper": {"proposed": 10, "accepted": 7, "emitted": 9, "steps": 3}},
            slab={"loads": 4, "evictions": 1, "resident": 2, "num_slots": 8},
        )
        for i in range(2)
    ]
    text = metrics.render(figures).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(samples, "loraserve_num_requests_running", replica="r1") == 1
    assert value(samples, "loraserve_kv_cache_usage_ratio", replica="r0") == 0.5
    assert value(samples, "loraserve_spec_decode_accepted_tokens_total", replica="r1",
                 adapter="upper") == 7  # fmt: skip
    assert value(samples, "loraserve_spec_decode_verification_steps_total", replica="r0",
                 adapter="upper") == 3  # fmt: skip
    assert value(samples, "loraserve_spec_decode_acceptance_ratio", replica="r0",
                 adapter="upper") == 0.7  # fmt: skip
    assert value(samples, "loraserve_adapter_slab_occupancy_ratio", replica="r0") == 0.25
    assert value(samples, "loraserve_adapter_evictions_total", replica="r1") == 1
