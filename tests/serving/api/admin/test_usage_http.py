"""Usage metering over HTTP: after a mixed workload with a restart in the middle, the totals of
GET /v1/usage equal the sums of the `usage` fields the answers carried, per tenant, adapter
and key; a user key sees its own tenant only; ranges are half-open on minutes, so ranges
that meet add up to the whole."""

import json
from collections import Counter, defaultdict
from datetime import datetime, timezone

import httpx
import pytest
from fastapi.testclient import TestClient

from adapters.registry.names import OPERATOR
from serving.api import create_app
from serving.api.batch.local_store import LocalBatch, memory_batch
from serving.api.core.batch_store import store_unreachable
from serving.api.core.tenancy import LocalTenancy, limits_getter
from serving.usage.record import UsageRecord
from serving.usage.service import Tenancy
from serving.usage.store import UsageStore
from tests.serving.api.held import Held
from tests.serving.api.served import ACME, ADMIN, GLOBEX, KEYS, MODEL_ID, serve, stub_settings

TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens")


def auth(key):
    return {"Authorization": f"Bearer {key}"}


SHARED = "one prompt that many requests begin with, long enough to fill cache blocks: "


def prompt(n):
    """Every other request repeats a long prefix, so that some prompt tokens come cached."""
    return f"{SHARED}{n}" if n % 2 else f"usage {n}"


def run(url, key, route, adapter, stream, n):
    """One request; the usage its answer carried, as (prompt, cached, completion), and how
    many choices it asked for (each metered as a request; the prompt billed once)."""
    if route == "workers":
        body = {"prompt": prompt(n), "max_tokens": 4 + n % 3, "stream": stream}
        if adapter:
            body["lora"] = adapter
        r = httpx.post(f"{url}/ai/run/{MODEL_ID}", json=body, headers=auth(key), timeout=60)
        assert r.status_code == 200, r.text
        if not stream:
            usage = r.json()["result"]["usage"]
        else:
            events = [json.loads(line[5:]) for line in r.text.splitlines()
                      if line.startswith("data:") and "[DONE]" not in line]  # fmt: skip
            usage = events[-1]["usage"]
        return (usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"]), 1
    choices = 2 if n % 5 == 1 else 1
    body = {
        "model": adapter or MODEL_ID,
        "prompt": prompt(n),
        "max_tokens": 3 + n % 4,
        "n": choices,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{url}/v1/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(line[5:]) for line in r.text.splitlines()
                  if line.startswith("data:") and "[DONE]" not in line]  # fmt: skip
        usage = chunks[-1]["usage"]
    else:
        usage = r.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return (usage["prompt_tokens"], cached, usage["completion_tokens"]), choices


def workload(url, sums, offset):
    for n in range(16):
        key = (ACME, GLOBEX)[(n // 2) % 2]
        adapter = (None, "upper", "rot13")[n % 3]
        route = ("workers", "openai")[(n // 2) % 2]
        got, choices = run(url, key, route, adapter, stream=n % 4 >= 2, n=n + offset)
        tenant = KEYS[key].tenant
        label = f"{OPERATOR}/{adapter}" if adapter else "base"
        for k, v in zip(TOKENS, got, strict=True):
            sums[tenant, label, KEYS[key].key_id][k] += v
        sums[tenant, label, KEYS[key].key_id]["requests"] += choices


def tenancy(path):
    return LocalTenancy(Tenancy(UsageStore(f"sqlite:///{path}"), limits_getter(lambda t: {})))


@pytest.fixture(scope="module")
def metered(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("usage")
    store = root / "usage.db"
    sums = defaultdict(Counter)  # (tenant, adapter label, key id) -> summed usage fields
    for half in range(2):  # the second half runs on a new server over the same store
        t = tenancy(store)
        with serve(world, root / f"run{half}", publish=("upper", "rot13"), owner=OPERATOR,
                   tenancy=t) as s:  # fmt: skip
            workload(s.url, sums, offset=10 * half)
        t.tenancy.close()
    t = tenancy(store)
    with serve(world, root / "query", publish=(), tenancy=t) as s:
        yield s.url, sums
    t.tenancy.close()


def usage(url, key, **params):
    r = httpx.get(f"{url}/v1/usage", params=params, headers=auth(key), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def totals(rows):
    """(requests, prompt, cached, completion) over rows, interactive and batch together."""
    out = Counter()
    for row in rows:
        for kind in ("interactive", "batch"):
            for k, v in row[kind].items():
                out[k] += v
    return out


def expected(sums, pick):
    out = Counter()
    for key, counts in sums.items():
        if pick(*key):
            out.update(counts)
    return out


def test_totals_equal_the_answers_usage_across_a_restart(metered):
    url, sums = metered
    assert sum(c["requests"] for c in sums.values()) > 32  # some answers had two choices
    assert expected(sums, lambda *k: True)["cached_tokens"] > 0  # the workload hit the cache
    assert totals(usage(url, ADMIN, group_by="tenant")) == expected(sums, lambda *k: True)
    for tenant in ("acme", "globex"):
        rows = usage(url, ADMIN, group_by="adapter", tenant=tenant)
        assert totals(rows) == expected(sums, lambda t, a, k, tenant=tenant: t == tenant)
        by_adapter = {row["adapter"]: totals([row]) for row in rows}
        for label in ("base", f"{OPERATOR}/upper", f"{OPERATOR}/rot13"):
            assert by_adapter.get(label, Counter()) == expected(
                sums, lambda t, a, k, label=label, tenant=tenant: t == tenant and a == label
            )
    rows = usage(url, ADMIN, group_by="key")
    assert {row["key_id"] for row in rows} == {KEYS[ACME].key_id, KEYS[GLOBEX].key_id}
    assert all(ACME not in json.dumps(row) for row in rows)  # ids, never the keys
    assert all(row["batch"]["requests"] == 0 for row in rows)


def test_a_user_key_sees_its_own_tenant_only(metered):
    url, sums = metered
    mine = usage(url, ACME, group_by="day")
    assert totals(mine) == expected(sums, lambda t, a, k: t == "acme")
    assert {row["tenant"] for row in mine} == {"acme"}
    r = httpx.get(f"{url}/v1/usage", params={"tenant": "globex"}, headers=auth(ACME))
    assert r.status_code == 403


def test_time_window_and_bad_queries(metered):
    url, _ = metered
    assert usage(url, ADMIN, group_by="tenant", end="2000-01-01T00:00:00Z") == []
    assert totals(usage(url, ADMIN, group_by="tenant", start="2000-01-01")) != Counter()
    for params, field in (
        ({"group_by": "model"}, "group_by"),
        ({"start": "yesterday"}, "start"),
        ({"end": "nan"}, "end"),
        ({"start": "2030-01-01", "end": "2020-01-01"}, "start"),
        ({"tenant": "a/b"}, "tenant"),
    ):
        r = httpx.get(f"{url}/v1/usage", params=params, headers=auth(ADMIN))
        assert r.status_code == 400 and field in r.text, (params, r.text)


T = datetime(2024, 3, 1, 0, 0, tzinfo=timezone.utc).timestamp()  # midnight, a minute's start


@pytest.fixture
def dated(world, tmp_path):
    """An app on a stub generator over a store holding usage around T, at known times."""
    t = tenancy(tmp_path / "usage.db")
    times = (T - 3600, T - 61, T - 1, T, T + 0.5, T + 30, T + 59.9, T + 60, T + 61, T + 7200)
    t.tenancy.store.record(
        [UsageRecord("acme", "k1", "base", "interactive", 10 + i, i, i, time=at)
         for i, at in enumerate(times)]
    )  # fmt: skip
    app = create_app(Held(), stub_settings(world, tmp_path), t)
    with TestClient(app) as client:
        yield client
    t.tenancy.close()


def requests_in(client, **params):
    r = client.get("/v1/usage", params={"group_by": "tenant", **params}, headers=auth(ACME))
    assert r.status_code == 200, r.text
    return r.json(), totals(r.json()["data"])


@pytest.mark.parametrize("cut", [0, 0.5, 30, 59.9, 60, 61, -1])
@pytest.mark.parametrize("form", ["epoch", "iso"])
def test_ranges_that_meet_count_every_minute_once(dated, cut, form):
    at = T + cut
    when = f"{at:.3f}" if form == "epoch" else datetime.fromtimestamp(at, timezone.utc).isoformat()
    _, whole = requests_in(dated)
    before, up_to = requests_in(dated, end=when)
    after, from_ = requests_in(dated, start=when)
    assert up_to + from_ == whole and up_to and from_  # usage on both sides, none twice
    minute = int(at // 60 * 60)
    assert (before["end"], before["end_time"], before["start_time"]) == (when, minute, None)
    assert (after["start"], after["start_time"], after["end_time"]) == (when, minute, None)


def test_a_day_holds_its_midnight_minute_and_not_the_next(dated):
    day = {"start": "2024-02-29T00:00:00Z", "end": "2024-03-01T00:00:00Z"}
    answer, got = requests_in(dated, **day)
    assert got["requests"] == 3  # T - 3600, T - 61, T - 1: usage at T is the next day's
    assert (answer["start_time"], answer["end_time"]) == (T - 86400, T)
    _, next_day = requests_in(dated, start="2024-03-01T00:00:00Z", end="2024-03-02")
    assert next_day["requests"] == 7
    _, empty = requests_in(dated, start=f"{T + 1}", end=f"{T + 59}")  # inside one minute
    assert empty["requests"] == 0


@pytest.mark.parametrize(
    "text", ["1_709_251_200", "١٧٠٩٢٥١٢٠٠", " 1709251200", "1e9", "inf", "0x10", "1e400"]
)
def test_epoch_seconds_are_plain_ascii_decimals(dated, text):
    r = dated.get("/v1/usage", params={"start": text}, headers=auth(ACME))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("start: "), r.text
    assert requests_in(dated, start="1709251200.5")[0]["start_time"] == 1709251200
    assert requests_in(dated, end="-60")[1]["requests"] == 0


class _DownBatch(LocalBatch):
    """A batch store that cannot be reached (a restarting Batch replica)."""

    async def holdings(self, tenant):
        raise store_unreachable()


def test_quotas_show_one_tenants_use_and_limits_and_none_for_all_tenants(world, tmp_path):
    limits = {"acme": {"batch_files": 7, "max_adapters": 2}}.get
    settings = stub_settings(world, tmp_path, limits_of=lambda t: limits(t, {}))
    batch = memory_batch()
    batch.store.add_file("acme", "batch", "a.jsonl", b"x" * 2**20)
    with TestClient(create_app(Held(), settings, tenancy(tmp_path / "u.db"), batch)) as client:
        mine = client.get("/v1/usage", headers=auth(ACME)).json()["quotas"]
        assert mine["batch_files"] == {"used": 1, "limit": 7}
        assert mine["batch_file_mb"] == {"used": 1.0, "limit": None}
        assert mine["max_adapters"] == {"used": 0, "limit": 2}
        named = client.get("/v1/usage", params={"tenant": "acme"}, headers=auth(ADMIN)).json()
        assert named["quotas"] == mine
        assert client.get("/v1/usage", headers=auth(ADMIN)).json()["quotas"] is None
    down = _DownBatch(batch.store, max_in_flight=1, ttl_s=60)
    with TestClient(create_app(Held(), settings, tenancy(tmp_path / "u.db"), down)) as client:
        r = client.get("/v1/usage", headers=auth(ACME))
        assert r.status_code == 200  # the usage rows do not wait for the batch store
        assert r.json()["quotas"]["batch_files"] == {"used": None, "limit": 7}
