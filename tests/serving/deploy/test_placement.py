"""Where adapters are served: affinity with 2 replicas and 6 adapters, and a hot adapter
spread over both replicas while each cold one stays on one (serving.deploy.router).

Counted from each replica's own figures (`loraserve_adapter_arrivals`: requests reaching a
replica's engine, by whether their adapter was in a slot), through the app's /metrics.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from adapters.registry.names import OPERATOR
from tests.serving.deploy.served import free_port, serving
from tests.serving.engine.world import ADAPTERS, build_world

pytestmark = pytest.mark.slow

NAMES = list(ADAPTERS)  # 6 adapters
HOT = NAMES[0]
MAX_NUM_SEQS = 16  # spread_at: 4 requests of one adapter in flight on each replica holding it
STREAMS = 8
STREAM_DEADLINE_S = 180  # one completion of a few dozen tokens takes seconds here
ROUTING_UPDATE_S = 2.0  # Ray's routers learn a replica's loaded ids a moment after the load


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("placement")
    world = build_world(root / "world")
    port = free_port()
    config = {
        "model": {"id": "tiny", "path": str(world.base_dir), "max_model_len": 256},
        "draft": {"method": "none"},
        # 4 slots a replica for 6 adapters: serving every adapter everywhere would evict.
        "lora": {"max_loras": 4, "max_lora_rank": 16, "max_cpu_loras": 8,
                 "registry": str(root / "registry"),
                 "preload": {name: str(world.root / name) for name in NAMES}},
        "cache": {"block_size": 4, "num_blocks": 1024},
        "scheduler": {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": 256},
        "server": {"host": "127.0.0.1", "port": port},
        "deploy": {"num_replicas": 2, "resources": {"num_cpus": 1, "num_gpus": 0}},
        "usage": {"store": f"sqlite:///{root / 'usage.db'}"},
        "batch": {"store": f"sqlite:///{root / 'batch.db'}"},
    }  # fmt: skip
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with serving(path, port, root / "home") as address:
        yield address


def arrivals(url: str) -> Counter:
    """(replica, adapter, resident) -> requests, from every replica's figures."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "loraserve_adapter_arrivals":
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = (s.labels["replica"], s.labels["adapter"], s.labels["resident"])
                    counts[key] = int(s.value)
    return counts


def drive(url: str, models: list[str], max_tokens: int = 8, streams: int = STREAMS) -> None:
    """Each model's completion, `streams` at a time; every one must succeed."""

    def one(model: str) -> None:
        body = {"model": model, "prompt": "hello there", "max_tokens": max_tokens,
                "temperature": 0, "stream": True}  # fmt: skip
        # A whole-answer deadline: the stream's keep-alive comments would outlast any read
        # timeout, so a stalled request would otherwise hold the test forever.
        deadline = time.monotonic() + STREAM_DEADLINE_S
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            received = b""
            for chunk in r.iter_bytes():
                received += chunk
                if time.monotonic() > deadline:  # what each replica's engine holds now
                    stats = httpx.get(f"{url}/v1/stats", timeout=30).text
                    raise AssertionError(f"{model}: no end after {STREAM_DEADLINE_S} s; {stats}")
            assert b"[DONE]" in received

    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(one, models))


def measured(url: str, models: list[str], max_tokens: int = 8) -> Counter:
    before = arrivals(url)
    drive(url, models, max_tokens)
    after = arrivals(url)
    return Counter({k: after[k] - before[k] for k in after if after[k] > before[k]})


def test_requests_land_where_their_adapter_is_resident(url):
    # Warm-up: each adapter's first request alone, so that Ray places it on one replica
    # (concurrent first requests of one adapter may each pick a replica before either
    # replica has reported it), then traffic at once.
    for name in NAMES:
        drive(url, [name], streams=1)
        time.sleep(ROUTING_UPDATE_S / 4)
    time.sleep(ROUTING_UPDATE_S)
    drive(url, NAMES * 2)
    # Round-robin: a burst of one adapter (4 of the 8 streams at once) would rightly copy it.
    models = NAMES * 20
    counts = measured(url, models)
    resident = sum(n for (_, _, r), n in counts.items() if r == "true")
    print(f"resident on arrival: {resident}/{len(models)}; {dict(counts)}")  # shown with -s
    assert sum(counts.values()) == len(models)
    assert resident >= 0.9 * len(models), counts


def test_a_hot_adapter_spreads_while_cold_ones_stay(url):
    rng = random.Random(1)
    cold = NAMES[1:]

    def traffic(n: int) -> list[str]:  # 90% on HOT, the rest dealt over the cold ones
        return [HOT if rng.random() < 0.9 else rng.choice(cold) for _ in range(n)]

    drive(url, traffic(60), max_tokens=24)  # the hot adapter's holder fills up; it is copied
    time.sleep(ROUTING_UPDATE_S)
    counts = measured(url, traffic(200), max_tokens=24)
    by_replica = Counter()
    for (replica, label, _), n in counts.items():
        by_replica[replica, label.removeprefix(f"{OPERATOR}/")] += n  # preloads: operator's
    replicas = {replica for replica, _ in by_replica}
    assert len(replicas) == 2, by_replica
    hot = sum(n for (_, a), n in by_replica.items() if a == HOT)
    print(f"requests by replica and adapter: {dict(by_replica)}")  # shown with -s
    for replica in replicas:
        assert 0.3 <= by_replica[replica, HOT] / hot <= 0.7, by_replica
    for adapter in cold:
        serving = [r for r in replicas if by_replica[r, adapter]]
        assert len(serving) <= 1, (adapter, by_replica)
