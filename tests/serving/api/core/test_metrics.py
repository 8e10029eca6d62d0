"""/metrics: Prometheus text that parses, request counters and latencies that move, engine
gauges per replica, an adapter label set that stays bounded, and adapter names shown only to
an admin key."""

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from adapters.format.adapter import load_adapter
from serving.api import create_app
from serving.api.batch.items import run_item
from serving.api.core.metrics import AdapterLabels, Metrics
from serving.batch.records import Item
from serving.engine.snapshot import EngineSnapshot
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.api.held import Held
from tests.serving.api.served import ACME, ADMIN, KEYS, MODEL_ID, serve, stub_settings
from tests.serving.api.slab_figures import slab_figures
from tests.serving.engine.world import base_model

AUTH = {"Authorization": f"Bearer {ACME}"}
VARIANT_REQUESTS = "loraserve_adapter_variant_requests_total"


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("metrics")) as s:
        yield s


def scrape_text(served, key: str | None = ADMIN) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(served.url + "/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


def samples_of(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(served, key: str | None = ADMIN) -> dict[tuple[str, tuple], float]:
    return samples_of(scrape_text(served, key))


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_move(served):
    before = scrape(served)
    for model in ("upper", MODEL_ID, "upper"):
        body = {"model": model, "prompt": "count me", "max_tokens": 3, "temperature": 0}
        r = httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200
    after = scrape(served)
    for label, n in (("acme/upper", 2), ("base", 1)):
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
    tenant = {"tenant": "acme", "kind": "interactive"}
    assert (
        value(after, "loraserve_tenant_requests_total", **tenant)
        - value(before, "loraserve_tenant_requests_total", **tenant)
        == 3
    )
    metered = value(after, "loraserve_tenant_tokens_total", type="prompt", **tenant) - value(
        before, "loraserve_tenant_tokens_total", type="prompt", **tenant
    )
    assert metered == 3 * len(served.text_ids("count me"))
    assert value(after, "loraserve_num_requests_running", replica="local") == 0
    assert value(after, "loraserve_adapter_loads_total", replica="local") >= 1
    assert 0 < value(after, "loraserve_adapter_slab_occupancy_ratio", replica="local") <= 1
    assert value(after, "loraserve_prefix_cache_queried_tokens_total", replica="local") > 0


def test_requests_are_counted_per_lora_variant(served, tmp_path):
    folder, _ = save_peft_adapter(
        tmp_path / "dora", rank=4, modules=["q_proj"], base=base_model(), use_dora=True
    )
    served.registry.publish("dora", load_adapter(folder), "acme")
    before = scrape(served)
    for model in ("upper", "rot13", "dora", MODEL_ID, "dora"):  # plain, rsLoRA, DoRA, base
        body = {"model": model, "prompt": "which kind", "max_tokens": 2, "temperature": 0}
        r = httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
    body = {"prompt": "which kind", "lora": "dora", "max_tokens": 2}  # Workers AI's route too
    r = httpx.post(f"{served.url}/ai/run/{MODEL_ID}", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    after = scrape(served)
    moved = {
        dict(labels)["variant"]: v - before.get((name, labels), 0.0)
        for (name, labels), v in after.items()
        if name == VARIANT_REQUESTS and v != before.get((name, labels), 0.0)
    }
    assert moved == {"plain": 1, "use_rslora": 1, "use_dora": 3}  # the base request is not


def test_variant_labels_are_bounded_and_summed_over_replicas():
    replicas = [Metrics(), Metrics()]
    for metrics in replicas:
        metrics.count_variants(("lora_bias", "rank_pattern"))
        metrics.count_variants(())
    replicas[1].count_variants(("some_future_variant",))
    figures = [EngineSnapshot(f"r{i}", 0, 0, 0.0, 0.0, 0, 0, 0, api=m.samples())
               for i, m in enumerate(replicas)]  # fmt: skip
    samples = samples_of(Metrics().render(figures).decode())
    counts = {v: value(samples, VARIANT_REQUESTS, variant=v) for v in
              ("lora_bias", "rank_pattern", "plain", "other", "some_future_variant")}  # fmt: skip
    assert counts == {"lora_bias": 2, "rank_pattern": 2, "plain": 2, "other": 1,
                      "some_future_variant": 0}  # fmt: skip


def test_adapter_labels_are_bounded():
    label = AdapterLabels(max_labels=2)
    assert [label(v) for v in ("a@1", "b@2", "c@3", "a@4", None)] == [
        "a",
        "b",
        "other",
        "a",
        "base",
    ]


def test_engine_snapshot_render_per_replica_and_adapter():
    metrics = Metrics()
    figures = [
        EngineSnapshot(
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
    samples = samples_of(metrics.render(figures).decode())
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


def test_adapter_memory_renders_per_replica():
    paged = slab_figures(
        page_rank=8, pages=64, pages_used=16, slab_bytes=64 << 20, slab_used_bytes=16 << 20,
        host_bytes=100 << 20, host_used_bytes=30 << 20, host_entries=3, resident=2, loads=12,
        registry_hits=5, evictions=4, host_evictions=1,
    )  # fmt: skip
    unbudgeted = slab_figures(pages=8, pages_used=2, host_used_bytes=1 << 20, host_entries=1)
    figures = [EngineSnapshot("r0", 0, 0, 0.0, 0.0, 0, 0, 0, slab=paged),
               EngineSnapshot("r1", 0, 0, 0.0, 0.0, 0, 0, 0, slab=unbudgeted),
               EngineSnapshot("r2", 0, 0, 0.0, 0.0, 0, 0, 0)]  # fmt: skip
    samples = samples_of(Metrics().render(figures).decode())
    expected = {
        "loraserve_adapter_slab_bytes": 64 << 20,
        "loraserve_adapter_slab_used_bytes": 16 << 20,
        "loraserve_adapter_slab_pages": 64,
        "loraserve_adapter_slab_used_pages": 16,
        "loraserve_adapter_host_budget_bytes": 100 << 20,
        "loraserve_adapter_host_used_bytes": 30 << 20,
        "loraserve_adapter_host_entries": 3,
        "loraserve_adapter_loads_total": 12,
        "loraserve_adapter_registry_loads_total": 5,
        "loraserve_adapter_evictions_total": 4,
        "loraserve_adapter_host_evictions_total": 1,
        # pages held, not adapters resident over slots (2 / 64)
        "loraserve_adapter_slab_occupancy_ratio": 0.25,
    }
    for name, want in expected.items():
        assert samples[(name, (("replica", "r0"),))] == want, name
    assert value(samples, "loraserve_adapter_slab_occupancy_ratio", replica="r1") == 0.25
    assert value(samples, "loraserve_adapter_host_used_bytes", replica="r1") == 1 << 20
    # no byte budget is no sample, not a budget of 0 that reads as full
    assert ("loraserve_adapter_host_budget_bytes", (("replica", "r1"),)) not in samples
    assert not any(dict(labels).get("replica") == "r2" and name.startswith("loraserve_adapter")
                   for name, labels in samples)  # fmt: skip


def adapter_labels(samples) -> set[str]:
    return {dict(labels)["adapter"] for _, labels in samples if "adapter" in dict(labels)}


def test_adapter_names_need_an_admin_key(served):
    body = {"model": "rot13", "prompt": "secret plans", "max_tokens": 1}
    r = httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200
    assert "acme/rot13" in adapter_labels(scrape(served, ADMIN))
    assert 'tenant="acme"' in scrape_text(served, ADMIN)
    pseudonyms = adapter_labels(scrape(served, None))
    for key in (None, ACME, "not-a-key"):
        text = scrape_text(served, key)
        assert "rot13" not in text and "upper" not in text, key
        assert "acme" not in text, key  # tenant names are pseudonyms too
        assert 'tenant="tenant-' in text, key
        assert adapter_labels(samples_of(text)) == pseudonyms  # stable from scrape to scrape
    assert any(label.startswith("adapter-") for label in pseudonyms) and "base" in pseudonyms


def test_pseudonyms_depend_on_the_keys():
    figures = [
        EngineSnapshot("r0", 0, 0, 0.0, 0.0, 0, 0, 0, spec={"upper": dict.fromkeys(
            ("proposed", "accepted", "emitted", "steps"), 1)})
    ]  # fmt: skip
    one, other = Metrics(pseudonym_key=b"one"), Metrics(pseudonym_key=b"two")
    hidden = samples_of(one.render(figures, adapter_names=False).decode())
    assert adapter_labels(hidden) == {one.pseudonym("upper")}
    assert one.pseudonym("upper") != other.pseudonym("upper") != "upper"
    assert one.pseudonym("base") == "base" and one.pseudonym("other") == "other"


def test_batch_items_are_counted_but_kept_out_of_the_latency_histograms(world, tmp_path):
    """A batch item's latency includes its queue's wait, by design: counted as a request,
    it would set off TTFT alerts whenever a large batch runs."""
    held = Held()
    held.release.set()
    app = create_app(held, stub_settings(world, tmp_path))
    client = TestClient(app, raise_server_exceptions=False)
    item = Item("job", 0, "acme", KEYS[ACME].key_id, MODEL_ID, "/ai/run", {"prompt": "hi"})
    assert asyncio.run(run_item(app, item)).status == 200
    r = client.post(f"/ai/run/{MODEL_ID}", json={"prompt": "hi"}, headers=AUTH)
    assert r.status_code == 200
    samples = samples_of(client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text)
    done = {"adapter": "base", "finish_reason": "length", "status": "200"}
    assert value(samples, "loraserve_requests_total", **done) == 2  # both requests
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "time_per_output_token_seconds"):  # fmt: skip
        assert value(samples, f"loraserve_{name}_count", adapter="base") == 1, name
