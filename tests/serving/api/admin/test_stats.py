"""GET /v1/stats over a real server: rates and TTFTs equal what the requests themselves saw,
adapter figures are scoped to what the key may see, usage equals the answers' `usage`, and
the last minute's figures never exceed what the rate limiter admitted in its window."""

import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from adapters.registry.names import OPERATOR
from serving.api import create_app
from serving.api.admin.stats import adapter_figures, replica_figures, summary
from serving.api.core.recent import Recent, rates, within
from serving.api.core.tenancy import LocalTenancy, limits_getter
from serving.api.core.ttft_sketch import bin_of, bounds
from serving.engine.snapshot import EngineSnapshot
from serving.engine.speculative.config import SpecConfig
from serving.usage.service import Tenancy
from serving.usage.store import UsageStore
from tests.serving.api.held import Held, post
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve, stub_settings
from tests.serving.usage.fakes import FakeClock

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
    expected = {
        "requests": len(acme),
        "tokens": sum(u["prompt_tokens"] + u["completion_tokens"] for u in acme),
    }
    assert usage["last_hour"] == expected
    minute = usage["last_minute"]
    assert {k: minute[k] for k in expected} == expected
    # acme has a requests limit: its requests are the limiter's; no tokens limit, the store's
    assert minute["source"] == {"requests": "limiter", "tokens": "store"}
    assert usage["limits"] == {
        "requests_per_minute": 600, "tokens_per_minute": None, "concurrent_requests": None,
        "max_adapters": 5, "max_adapter_mb": None, "batch_queued_requests": None,
        "batch_files": None, "batch_file_mb": None,
    }  # fmt: skip
    assert usage["batch_pending"] == 0
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
    kept = list(range(100, 200))  # ended in (19.9 - 10, 19.9]: the seconds 1010 to 1019
    got = rates(within(recent.buckets(), clock[0], 10), 10)
    assert got["tokens_per_s"] == pytest.approx(sum(i % 7 for i in kept) / 10)
    assert got["requests_per_s"] == pytest.approx(len(kept) / 10)
    window = ttfts[kept]
    for q, key in ((50, "ttft_p50_s"), (99, "ttft_p99_s")):
        # the sketch's figure lies in the bin of the exact percentile
        low, high = bounds(bin_of(np.percentile(window, q, method="inverted_cdf")))
        assert low <= got[key] < high
    assert rates([], 10)["ttft_p50_s"] is None and rates([], 10)["ttft_p99_s"] is None


def test_last_minute_never_exceeds_what_the_limiter_admitted(world, tmp_path):
    # The limiter's clock is a fake one: 61 s pass for the limiter while the usage store's
    # records stay in this minute, as they do in the minute after a burst.
    clock = FakeClock()
    limits = {"acme": {"requests_per_minute": 30, "tokens_per_minute": 100_000}}
    settings = stub_settings(world, tmp_path, limits_of=lambda t: limits.get(t, {}))
    usage = UsageStore("sqlite:///:memory:")
    tenancy = LocalTenancy(Tenancy(usage, limits_getter(settings.limits_of), clock))
    held = Held()
    held.release.set()
    client = TestClient(create_app(held, settings, tenancy))

    def last_minute(key=ACME):
        r = client.get("/v1/stats", headers=auth(key))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["last_minute"]

    burst = [post(client, ACME) for _ in range(31)]
    assert [r.status_code for r in burst] == [200] * 30 + [429]
    minute = last_minute()
    assert minute["requests"] == 30  # what the limiter admitted in its window
    assert minute["tokens"] == sum(r.json()["usage"]["total_tokens"] for r in burst[:30])
    clock.advance(61)
    assert last_minute()["requests"] == 0
    later = [post(client, ACME) for _ in range(2)]
    assert [r.status_code for r in later] == [200, 200]
    minute = last_minute()
    assert (minute["requests"], minute["tokens"]) == (2, 10)  # 3 prompt + 2 completion each
    assert minute["source"] == {"requests": "limiter", "tokens": "limiter"}
    # globex has no rate limit: the store's minutes since `since`, named as such
    assert post(client, GLOBEX).status_code == 200
    minute = last_minute(GLOBEX)
    assert minute["source"] == {"requests": "store", "tokens": "store"}
    assert minute["requests"] == 1 and minute["since"] % 60 == 0
    assert time.time() - 120 < minute["since"] <= time.time() - 60
    usage.close()


def test_the_answer_names_the_keys_tenant_and_scope(served):
    assert stats(served, ACME)["key"] == {"tenant": "acme", "scope": "user"}
    admin = stats(served, ADMIN, tenant="acme")
    assert admin["key"] == {"tenant": "ops", "scope": "admin"} and admin["tenant"] == "acme"


def test_speculation_counts_only_the_callers_own_requests(world, tmp_path):
    # Counted where verification happens, by the request's tenant: on a public adapter a
    # tenant sees what its own requests drafted, never another's; an admin, everyone's.
    with serve(world, tmp_path, owner=OPERATOR, publish=("upper",),
               speculative=SpecConfig(method="ngram")) as s:  # fmt: skip
        body = {"model": "upper", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        for key, prompt in ((ACME, [5, 6, 7] * 4), (GLOBEX, [5, 6, 7] * 3 + [5, 6])):
            r = httpx.post(f"{s.url}/v1/completions", json={**body, "prompt": prompt},
                           headers=auth(key), timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
        admin, acme, globex = (stats(s, key) for key in (ADMIN, ACME, GLOBEX))

    def spec(answer):
        (row,) = [a for a in answer["adapters"] if a["adapter"] == "operator/upper"]
        return row["spec"]

    everyone, own = spec(admin), {"acme": spec(acme), "globex": spec(globex)}
    for key in ("proposed", "accepted"):  # both drafted, differently
        assert 0 < own["acme"][key] != own["globex"][key] > 0
        assert own["acme"][key] + own["globex"][key] == everyone[key]
    for answer, tenant in ((acme, "acme"), (globex, "globex")):
        rate = own[tenant]["acceptance_rate"]
        assert rate == own[tenant]["accepted"] / own[tenant]["proposed"]
        assert answer["summary"]["spec_acceptance_rate"] == rate
        assert answer["replicas"][0]["spec_acceptance_rate"] == rate


def test_speculation_of_a_tenant_adds_up_over_replicas():
    counts = {"proposed": 10, "accepted": 4, "emitted": 6, "steps": 3}
    figures = [
        EngineSnapshot(
            f"r{i}", 0, 0, 0.0, 0.0, 0, 0, 0,
            spec={"operator/pub": {k: 2 * v for k, v in counts.items()}},
            spec_by_tenant={"acme": {"operator/pub": counts},
                            "globex": {"operator/pub": {**counts, "accepted": 9}}},
        )
        for i in range(2)
    ]  # fmt: skip
    visible = {"operator/pub", "base"}.__contains__

    def pub(counted):
        (row,) = adapter_figures(figures, {}, 30, [], [], visible, counted)
        return row["spec"]

    assert pub("acme".__eq__) == {"proposed": 20, "accepted": 8, "acceptance_rate": 0.4}
    assert pub(lambda tenant: True) == {"proposed": 40, "accepted": 26, "acceptance_rate": 0.65}
    assert summary(figures, [], 30, visible, "globex".__eq__)["spec_acceptance_rate"] == 0.9
    assert replica_figures(figures[0], [], 30, visible, "nobody".__eq__)[
        "spec_acceptance_rate"
    ] is None  # fmt: skip
