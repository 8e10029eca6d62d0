"""GET /v1/stats over a real server: rates and TTFTs equal what the requests themselves saw,
adapter figures are scoped to what the key may see, usage equals the answers' `usage`."""

import time

import httpx
import numpy as np
import pytest

from adapters.names import OPERATOR
from serving.api.recent import Recent, percentile, rates
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve

LIMITS = {"acme": {"requests_per_minute": 600, "max_adapters": 5}}


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    with serve(world, root, limits_of=lambda t: LIMITS.get(t, {})) as s:
        # globex owns one adapter of its own, never visible to acme
        s.registry.publish("mlp", world.adapters[world.versions["mlp"]], "globex")
        yield s


def complete(served, key, model, n):
    body = {"model": model, "prompt": f"stats {n}", "max_tokens": 3 + n % 3, "temperature": 0}
    t0 = time.time()
    r = httpx.post(f"{served.url}/v1/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"], time.time() - t0


def stats(served, key, **params):
    r = httpx.get(f"{served.url}/v1/stats", headers=auth(key), params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_figures_equal_the_requests_and_are_scoped(served):
    sent = [("acme", ACME, "upper"), ("acme", ACME, MODEL_ID), ("globex", GLOBEX, "mlp")] * 3
    usages = [(tenant, model, *complete(served, key, model, i)) for i, (tenant, key, model)
              in enumerate(sent)]  # fmt: skip
    s = stats(served, ACME)
    window = s["window_s"]
    # The window (30 s) holds every request just sent: the rates are their sums over it.
    completion = sum(u["completion_tokens"] for *_, u, _ in usages)
    assert s["summary"]["tokens_per_s"] * window == pytest.approx(completion)
    assert s["summary"]["requests_per_s"] * window == pytest.approx(len(sent))
    assert s["summary"]["replicas"] == 1 and s["replicas"][0]["replica"] == "local"
    # TTFT percentiles are of the server's own TTFTs, each under the client's whole time.
    longest = max(elapsed for *_, elapsed in usages)
    assert 0 < s["summary"]["ttft_p50_s"] <= s["summary"]["ttft_p99_s"] <= longest
    assert s["summary"]["running"] == 0 and s["summary"]["waiting"] == 0
    assert 0 <= s["summary"]["prefix_cache_hit_rate"] <= 1  # prompts were looked up

    by_label = {a["adapter"]: a for a in s["adapters"]}
    assert "globex/mlp" not in by_label  # another tenant's adapter is never named
    upper = by_label["acme/upper"]
    assert upper["residency"] == {"local": "slab"}
    acme_upper = [(u, e) for t, m, u, e in usages if m == "upper"]
    assert upper["requests_1h"] == len(acme_upper)
    assert upper["tokens_1h"] == sum(u["prompt_tokens"] + u["completion_tokens"]
                                     for u, _ in acme_upper)  # fmt: skip
    assert upper["tokens_per_s"] * window == pytest.approx(
        sum(u["completion_tokens"] for u, _ in acme_upper)
    )
    assert time.time() - 120 < upper["last_used"] <= time.time()
    # base traffic here is acme's only: other tenants' base use is not acme's usage
    assert by_label["base"]["requests_1h"] == 3

    usage = s["usage"]
    acme = [u for t, _, u, _ in usages if t == "acme"]
    assert usage["tenant"] == "acme"
    assert (
        usage["last_minute"]
        == usage["last_hour"]
        == {
            "requests": len(acme),
            "tokens": sum(u["prompt_tokens"] + u["completion_tokens"] for u in acme),
        }
    )
    assert usage["limits"] == {
        "requests_per_minute": 600, "tokens_per_minute": None, "concurrent_requests": None,
        "max_adapters": 5, "max_adapter_mb": None,
    }  # fmt: skip
    assert usage["adapters"] == 3  # upper, rot13, mlp published for acme
    assert usage["adapter_mb"] > 0

    g = stats(served, GLOBEX)
    labels = {a["adapter"]: a for a in g["adapters"]}
    # acme's base requests are not globex's traffic, though the load is everyone's
    assert "base" not in labels or labels["base"]["tokens_per_s"] == 0
    assert "globex/mlp" in labels and not any(label.startswith("acme/") for label in labels)
    assert g["summary"]["requests_per_s"] == s["summary"]["requests_per_s"]  # load is shared
    admin = stats(served, ADMIN)
    assert admin["usage"]["tenant"] == "ops" and {"acme/upper", "globex/mlp"} <= {
        a["adapter"] for a in admin["adapters"]
    }
    assert stats(served, ADMIN, tenant="globex")["usage"]["adapters"] == 1


def test_public_adapters_are_shown_to_every_tenant(served, world):
    served.registry.publish("rot13", world.adapters[world.versions["rot13"]], OPERATOR)
    served.registry.set_public("rot13", OPERATOR, True)
    complete(served, GLOBEX, "rot13", 0)
    labels = {a["adapter"] for a in stats(served, GLOBEX)["adapters"]}
    assert "operator/rot13" in labels


def test_refusals(served):
    url = f"{served.url}/v1/stats"
    assert httpx.get(url).status_code == 401
    r = httpx.get(url, headers=auth(ACME), params={"tenant": "globex"})
    assert r.status_code == 403 and "acme" in r.json()["error"]["message"]
    r = httpx.get(url, headers=auth(ADMIN), params={"tenant": "no such/tenant"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("tenant: ")


def test_window_rates_and_percentiles_against_numpy():
    clock = [1000.0]
    recent = Recent(window_s=10, clock=lambda: clock[0])
    rng = np.random.default_rng(0)
    ttfts = rng.exponential(0.05, size=200)
    for i, t in enumerate(ttfts):
        clock[0] = 1000.0 + i * 0.1  # 20 s of requests: the first half leaves the window
        recent.add("acme", "acme/a" if i % 2 else "base", float(t), i % 7)
    events = recent.events()
    kept = list(range(100, 200))  # ended in (19.9 - 10, 19.9]
    assert [e.tokens for e in events] == [i % 7 for i in kept]
    got = rates(list(events), 10)
    assert got["tokens_per_s"] == pytest.approx(sum(i % 7 for i in kept) / 10)
    assert got["requests_per_s"] == pytest.approx(len(kept) / 10)
    window = ttfts[kept]
    for q, key in ((50, "ttft_p50_s"), (99, "ttft_p99_s")):
        assert got[key] == pytest.approx(np.percentile(window, q, method="inverted_cdf"))
    assert percentile([], 50) is None and rates([], 10)["ttft_p99_s"] is None
