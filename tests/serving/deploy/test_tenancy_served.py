"""Tenants' limits and usage through Ray Serve with two replicas serving HTTP: one Tenancy
deployment holds the counters, so a limit holds across replicas, and usage recorded by
either replica adds up to what the answers said."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest
import yaml

from serving.api.core.caller import key_id
from tests.serving.deploy.served import MODEL_ID, free_port, serving, write_config
from tests.serving.engine.world import build_world

KEYS = {"acme-key-0123456789": "acme", "globex-key-0123456": "globex", "ops-key-0123456789": "ops"}
ACME, GLOBEX, OPS = KEYS
RPM = 6


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("tenancy")
    world = build_world(root / "world")
    port = free_port()
    path = write_config(root, world, port)
    config = yaml.safe_load(path.read_text())
    keys = root / "keys.txt"
    keys.write_text("".join(
        f"{k} {t} {'admin' if t == 'ops' else 'user'}\n" for k, t in KEYS.items()
    ))  # fmt: skip
    config["server"]["api_keys_file"] = str(keys)
    config["limits"] = {"tenants": {"acme": {"requests_per_minute": RPM}}}
    path.write_text(yaml.safe_dump(config))
    with serving(path, port, root / "home") as address:
        yield address


def complete(url, key, n):
    body = {"model": MODEL_ID, "prompt": f"limit {n}", "max_tokens": 2}
    return httpx.post(
        f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )  # fmt: skip


def test_a_limit_holds_across_replicas_and_usage_adds_up(url):
    answers = []
    lock = threading.Lock()

    def client(i):
        r = complete(url, ACME if i % 2 else GLOBEX, i)
        with lock:
            answers.append((i % 2, r))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acme = Counter(r.status_code for odd, r in answers if odd)
    globex = Counter(r.status_code for odd, r in answers if not odd)
    assert acme == {200: RPM, 429: 20 - RPM}, acme
    assert globex == {200: 20}, globex
    refused = next(r for odd, r in answers if odd and r.status_code == 429)
    assert refused.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert int(refused.headers["retry-after"]) >= 1

    # both replicas took requests, and what they recorded is what the answers said
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPS}"}).text
    arrivals = [
        line for line in metrics.splitlines()
        if line.startswith("loraserve_adapter_arrivals_total{") and float(line.split()[-1]) > 0
    ]  # fmt: skip
    assert len({line.split('replica="')[1].split('"')[0] for line in arrivals}) == 2, arrivals
    said = Counter()
    for odd, r in answers:
        if r.status_code == 200:
            usage = r.json()["usage"]
            tenant = "acme" if odd else "globex"
            said[tenant, "requests"] += 1
            said[tenant, "prompt_tokens"] += usage["prompt_tokens"]
            said[tenant, "completion_tokens"] += usage["completion_tokens"]
    rows = httpx.get(
        f"{url}/v1/usage", params={"group_by": "key"},
        headers={"Authorization": f"Bearer {OPS}"}, timeout=30,
    ).json()["data"]  # fmt: skip
    recorded = Counter()
    for row in rows:
        for field in ("requests", "prompt_tokens", "completion_tokens"):
            recorded[row["tenant"], field] += row["interactive"][field]
    assert recorded == said
    assert {row["key_id"] for row in rows} == {key_id(ACME), key_id(GLOBEX)}


def test_a_batch_runs_on_the_replicas_and_is_metered_as_batch(url):
    # The Batch deployment's feeder runs each item on a ModelServer, through its own route.
    auth = {"Authorization": f"Bearer {GLOBEX}"}
    bodies = [{"prompt": f"batch {i}", "raw": True, "max_tokens": 3, "temperature": 0}
              for i in range(6)]  # fmt: skip
    r = httpx.post(f"{url}/ai/run/{MODEL_ID}?queueRequest=true", json={"requests": bodies},
                   headers=auth, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    request_id = r.json()["result"]["request_id"]
    deadline = time.monotonic() + 120
    while True:
        poll = httpx.post(f"{url}/ai/run/{MODEL_ID}", json={"request_id": request_id},
                          headers=auth, timeout=60).json()["result"]  # fmt: skip
        if poll["status"] == "done" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert poll["status"] == "done" and poll["completed"] == 6, poll
    for body, answer in zip(bodies, poll["responses"], strict=True):
        direct = httpx.post(f"{url}/ai/run/{MODEL_ID}", json=body, headers=auth, timeout=60)
        assert answer["result"]["response"] == direct.json()["result"]["response"]
    rows = httpx.get(f"{url}/v1/usage", params={"group_by": "tenant"}, headers=auth,
                     timeout=30).json()["data"]  # fmt: skip
    batch = rows[0]["batch"]
    assert batch["requests"] == 6
    assert batch["completion_tokens"] == poll["usage"]["completion_tokens"]


def test_stats_add_up_every_replica(url):
    # Each replica's app keeps the requests it served; /v1/stats on either gathers them all.
    sent = [complete(url, GLOBEX, 100 + i) for i in range(12)]
    assert all(r.status_code == 200 for r in sent)
    ops = {"Authorization": f"Bearer {OPS}"}
    s = httpx.get(f"{url}/v1/stats", headers=ops, timeout=30).json()
    replicas = s["replicas"]
    assert s["summary"]["replicas"] == len(replicas) == 2
    assert len({r["replica"] for r in replicas}) == 2
    assert s["summary"]["requests_per_s"] * s["window_s"] >= len(sent) - 1e-6
    assert s["summary"]["tokens_per_s"] == pytest.approx(sum(r["tokens_per_s"] for r in replicas))
    assert s["summary"]["ttft_p50_s"] is not None
    for a in s["adapters"]:
        assert set(a["residency"]) <= {r["replica"] for r in replicas}
    acme = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {ACME}"}, timeout=30)
    assert acme.json()["usage"]["limits"]["requests_per_minute"] == RPM


def test_stats_count_speculation_of_the_keys_own_tenant(url):
    # Each replica counts speculation per tenant, the ingress adds the replicas up: globex's
    # drafts on the public preloaded adapter are globex's and an admin's figures, not acme's.
    body = {"model": f"{MODEL_ID}:upper", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    for i in range(4):
        r = httpx.post(f"{url}/v1/completions", json={**body, "prompt": [5, 6, 7] * (3 + i)},
                       headers={"Authorization": f"Bearer {GLOBEX}"}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text

    def upper(key):
        s = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        (row,) = [a for a in s.json()["adapters"] if a["name"] == "upper"]
        return row["spec"]

    everyone = upper(OPS)
    assert everyone["proposed"] > 0
    assert upper(GLOBEX) == everyone and upper(ACME) is None
