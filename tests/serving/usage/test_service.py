"""serving.usage.service: Tenancy admits, frees and records; limits come from the config."""

import threading

import pytest

from serving.config import parse_config
from serving.usage import (
    Limits,
    RateLimited,
    Tenancy,
    UsageRecord,
    UsageStore,
    UsageStoreError,
    limits_from_config,
)
from tests.serving.usage.fakes import FakeClock


def _record(tenant="acme", prompt=30, completion=20, kind="interactive", key_id="k1"):
    return UsageRecord(tenant, key_id, "base", kind, prompt, 4, completion, time=1_700_000_000.0)


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/usage.db"


def test_finish_records_usage_committed_before_it_returns(url):
    tenancy = Tenancy(UsageStore(url), lambda tenant: Limits(tokens_per_minute=1000))
    admission = tenancy.admit("acme", 400)
    tenancy.finish(admission, _record())
    other = UsageStore(url)  # another connection sees it: it is committed, not buffered
    assert other.totals()["interactive"] == {
        "requests": 1,
        "prompt_tokens": 30,
        "cached_tokens": 4,
        "completion_tokens": 20,
    }
    other.close()
    rows = tenancy.usage(group_by="key", tenant="acme")
    assert [row["key_id"] for row in rows] == ["k1"]
    tenancy.close()


def test_finish_charges_the_tokens_used_not_the_reservation(url):
    tenancy = Tenancy(UsageStore(url), lambda tenant: Limits(tokens_per_minute=1000), FakeClock())
    tenancy.finish(tenancy.admit("acme", 900), _record(prompt=100, completion=50))
    remaining = dict(tenancy.admit("acme", 0).headers)["x-ratelimit-remaining-tokens"]
    assert remaining == "850"
    tenancy.close()


def test_a_request_that_never_ran_is_charged_nothing_and_not_recorded(url):
    tenancy = Tenancy(UsageStore(url), lambda tenant: Limits(tokens_per_minute=100), FakeClock())
    tenancy.finish(tenancy.admit("acme", 100), None)
    tenancy.admit("acme", 100)  # the whole budget is back
    assert tenancy.usage() == []
    tenancy.finish(None, _record(kind="batch"))  # a batch item: usage without admission
    assert tenancy.usage(group_by="tenant")[0]["batch"]["requests"] == 1
    tenancy.close()


def test_a_failing_store_still_frees_the_admission_and_spools_the_record(url):
    store = UsageStore(url)
    tenancy = Tenancy(store, lambda tenant: Limits(concurrent_requests=1))
    admission = tenancy.admit("acme", 0)
    store.close()
    tenancy.finish(admission, _record())  # the write fails: spooled, not the caller's error
    assert tenancy.limiter.in_flight("acme") == 0
    tenancy.admit("acme", 0)
    again = UsageStore(url)  # the next start replays it
    assert again.totals()["interactive"]["requests"] == 1
    again.close()


def test_a_store_in_memory_has_no_spool_and_its_failures_raise():
    store = UsageStore("sqlite:///:memory:")
    tenancy = Tenancy(store, lambda tenant: Limits())
    store.close()
    with pytest.raises(UsageStoreError, match=r"usage store :memory:: cannot write to it"):
        tenancy.finish(None, _record())


def test_a_finish_past_the_running_ttl_frees_nothing_but_is_recorded(url):
    clock = FakeClock()
    tenancy = Tenancy(
        UsageStore(url), lambda tenant: Limits(concurrent_requests=1), clock, running_ttl_s=600
    )
    lost = tenancy.admit("acme", 10)
    clock.advance(600)
    tenancy.admit("acme", 10)  # the lost request's place was given away at the TTL
    tenancy.finish(lost, _record())
    with pytest.raises(RateLimited):  # the late finish did not free the new one's place
        tenancy.admit("acme", 10)
    assert tenancy.usage(group_by="tenant")[0]["interactive"]["requests"] == 1
    tenancy.close()


def test_without_a_store_usage_is_not_kept():
    tenancy = Tenancy(None, lambda tenant: Limits())
    tenancy.finish(tenancy.admit("acme", 5), _record())
    assert tenancy.usage(group_by="day") == []
    tenancy.close()


def test_the_limiters_window_counts_what_the_limits_hold_to(url):
    clock = FakeClock()
    limits = {"acme": Limits(30, 10_000), "solo": Limits(requests_per_minute=5)}
    tenancy = Tenancy(UsageStore(url), lambda t: limits.get(t, Limits()), clock)

    def window(tenant="acme"):
        return tenancy.window(tenant)

    burst = [tenancy.admit("acme", 100) for _ in range(30)]
    for admission in burst[:20]:
        tenancy.finish(admission, _record())  # 50 tokens used of the 100 reserved
    assert window() == {"requests": 30, "tokens": 20 * 50 + 10 * 100, "running": 10}
    clock.advance(60)  # the window is (t - 60, t]: the burst has left it, 10 still run
    assert window() == {"requests": 0, "tokens": 0, "running": 10}
    tenancy.admit("acme", 7)
    assert window() == {"requests": 1, "tokens": 7, "running": 11}
    tenancy.admit("solo", 7)
    assert window("solo") == {"requests": 1, "tokens": None, "running": 1}
    assert window("free") == {"requests": None, "tokens": None, "running": 0}
    assert "free" not in tenancy.limiter._tenants  # reading keeps no state
    tenancy.close()


def test_threads_admitting_and_finishing_lose_no_usage(url):
    tenancy = Tenancy(UsageStore(url), lambda tenant: Limits(concurrent_requests=4))
    finished, lock = [], threading.Lock()

    def run(worker):
        for i in range(60):
            try:
                admission = tenancy.admit("acme", 10)
            except RateLimited:
                continue
            tenancy.finish(admission, _record(prompt=i, completion=worker, key_id=f"k{worker}"))
            with lock:
                finished.append((i, worker))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = tenancy.usage(group_by="tenant")[0]["interactive"]
    assert totals["requests"] == len(finished) > 0
    assert totals["prompt_tokens"] == sum(i for i, _ in finished)
    assert totals["completion_tokens"] == sum(w for _, w in finished)
    assert tenancy.limiter.in_flight("acme") == 0
    tenancy.close()


def test_limits_from_config_merges_each_tenant_over_the_defaults():
    section = parse_config(
        {
            "limits": {
                "requests_per_minute": 60,
                "concurrent_requests": 4,
                "max_adapters": 3,
                "tenants": {
                    "acme": {"requests_per_minute": 600, "tokens_per_minute": 5000},
                    "free": {"concurrent_requests": None},
                },
            }
        }
    ).limits
    limits_of = limits_from_config(section)
    assert limits_of("acme") == Limits(600, 5000, 4)
    assert limits_of("free") == Limits(60, None, None)  # an explicit null lifts the default
    assert limits_of("anyone") == Limits(60, None, 4)
    assert limits_from_config(parse_config({}).limits)("x").unlimited


def test_finish_many_releases_each_admission_and_writes_every_record(url, caplog):
    """A batch of finishes from replicas: each admission freed and charged what it used, the
    records written together; one that cannot be released (a bad count) is logged and holds
    up neither the others nor the records."""
    tenancy = Tenancy(UsageStore(url), lambda t: Limits(concurrent_requests=3), FakeClock())
    first, bad, last = (tenancy.admit("acme", 10) for _ in range(3))
    tenancy.finish_many([(first, _record(completion=1), None), (bad, _record(completion=2), -1),
                         (last, _record(completion=3), 7)])  # fmt: skip
    assert tenancy.window("acme")["running"] == 1  # only the bad one still holds its place
    totals = tenancy.store.totals()["interactive"]
    assert totals["requests"] == 3 and totals["completion_tokens"] == 1 + 2 + 3
    assert "was not released" in caplog.text
    tenancy.close()
