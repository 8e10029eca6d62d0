"""serving.usage.store: exact sums, every grouping, time filters, kinds apart, restarts."""

import random
import sqlite3
from collections import Counter
from datetime import datetime, timezone

import pytest

from serving.usage.record import COUNTS, KINDS, UsageRecord
from serving.usage.store import UsageStore, UsageStoreError

T0 = datetime(2024, 3, 1, 23, 58, tzinfo=timezone.utc).timestamp()  # two minutes to midnight
MINUTE = int(T0 // 60 * 60)
GROUP_KEYS = {"adapter": "adapter", "key": "key_id", "day": "day", "tenant": None}


def _rec(tenant="acme", key_id="k1", adapter="base", kind="interactive", time=T0, **counts):
    counts = {"prompt_tokens": 10, "cached_tokens": 2, "completion_tokens": 5, **counts}
    return UsageRecord(tenant, key_id, adapter, kind, time=time, **counts)


def _day(time: float) -> str:
    return datetime.fromtimestamp(time, tz=timezone.utc).strftime("%Y-%m-%d")


def _expected(records, group_by, start=None, end=None, tenant=None) -> list[dict]:
    """The rows query() should give, summed record by record (no minutes, no SQL)."""
    label = GROUP_KEYS[group_by]
    rows = {}
    for r in records:
        minute = r.time // 60 * 60
        if (start is not None and minute < start // 60 * 60) or (
            end is not None and minute >= end // 60 * 60
        ):
            continue
        if tenant is not None and r.tenant != tenant:
            continue
        group = {"adapter": r.adapter, "key": r.key_id, "day": _day(r.time), "tenant": ""}
        key = (r.tenant, group[group_by])
        row = rows.setdefault(
            key,
            {"tenant": r.tenant, **({label: key[1]} if label else {})}
            | {k: dict.fromkeys(COUNTS, 0) for k in KINDS}
            | {"last_used": minute},
        )
        row["last_used"] = max(row["last_used"], minute)
        for name in COUNTS:
            row[r.kind][name] += getattr(r, name)
    return [rows[k] for k in sorted(rows)]


def _random_records(rng: random.Random, n: int) -> list[UsageRecord]:
    return [
        _rec(
            tenant=rng.choice(["acme", "beta", "zeta"]),
            key_id=rng.choice(["k1", "k2", "k3"]),
            adapter=rng.choice(["base", "acme/sql", "beta/chat"]),
            kind=rng.choice(KINDS),
            time=T0 + rng.uniform(-3600, 3 * 3600),  # across midnight: two days
            prompt_tokens=rng.randrange(0, 500),
            cached_tokens=rng.randrange(0, 100),
            completion_tokens=rng.randrange(0, 300),
            requests=rng.choice([1, 1, 1, 3]),
        )
        for _ in range(n)
    ]


@pytest.fixture
def store(tmp_path):
    store = UsageStore(f"sqlite:///{tmp_path}/usage.db")
    yield store
    store.close()


@pytest.mark.parametrize("group_by", sorted(GROUP_KEYS))
def test_grouped_sums_are_exact(store, group_by):
    records = _random_records(random.Random(7), 600)
    for i in range(0, len(records), 37):  # several transactions of several records
        store.record(records[i : i + 37])
    rows = store.query(group_by=group_by)
    assert rows == _expected(records, group_by)
    assert len({r["tenant"] for r in rows}) == 3
    if group_by == "day":
        assert {r["day"] for r in rows} == {"2024-03-01", "2024-03-02"}
    for tenant in ("acme", "nobody"):
        expected = _expected(records, group_by, tenant=tenant)
        assert store.query(group_by=group_by, tenant=tenant) == expected


@pytest.mark.parametrize(
    ("start", "end"),
    [(T0, None), (None, T0), (T0 + 30, T0 + 3600), (T0 + 60, T0 + 121), (T0 + 7200, T0)],
)
def test_start_and_end_resolve_to_the_minute(store, start, end):
    records = _random_records(random.Random(11), 400)
    store.record(records)
    for group_by in GROUP_KEYS:
        rows = store.query(start=start, end=end, group_by=group_by)
        assert rows == _expected(records, group_by, start, end)


def test_ranges_are_half_open_on_minutes(store):
    store.record([_rec(time=T0 + 10), _rec(time=T0 + 70)])  # minutes T0 and T0 + 60
    requests = lambda **kw: store.totals(**kw)["interactive"]["requests"]  # noqa: E731
    assert requests(start=T0, end=T0 + 60) == 1  # minute T0 only
    assert requests(start=T0 + 59, end=T0 + 60) == 1  # start resolves to minute T0
    assert requests(start=T0 + 60, end=T0 + 120) == 1  # minute T0 + 60 only
    assert requests(start=T0 + 59, end=T0 + 119) == 1  # end's minute T0 + 60 is left out
    assert requests(start=T0 + 59, end=T0 + 59) == 0  # an empty range
    assert requests(start=T0 + 30, end=T0 + 120) == 2
    assert requests(start=T0 + 120) == 0
    assert requests(end=T0 + 59.999) == 0
    assert requests(end=T0 + 60) == 1


@pytest.mark.parametrize("cut", [0, 0.5, 10, 59.999, 60, 61, 90, 3600])
def test_ranges_that_meet_add_up_to_all_usage(store, cut):
    # Usage before, in and after T's minute, T on a minute boundary or not: what ends at T
    # plus what starts at T is everything, each minute once (a day-by-day export's sum).
    records = _random_records(random.Random(5), 300)
    records += [_rec(time=T0 + cut + d) for d in (-61, -1, -0.001, 0, 0.001, 1, 59, 61)]
    store.record(records)
    T = T0 + cut
    for group_by in GROUP_KEYS:
        whole = store.query(group_by=group_by)
        before = store.query(group_by=group_by, end=T)
        after = store.query(group_by=group_by, start=T)
        assert _sums(before) + _sums(after) == _sums(whole)
        assert before and after
    assert _sums(store.query(start=T, end=T)) == _sums([])


def _sums(rows) -> Counter:
    """Every count of rows, per (tenant, group, kind, count)."""
    out = Counter()
    for row in rows:
        group = tuple(v for k, v in row.items() if k not in (*KINDS, "last_used"))
        for kind in KINDS:
            for name in COUNTS:
                out[(*group, kind, name)] += row[kind][name]
    return out


def test_interactive_and_batch_are_counted_apart(store):
    store.record([_rec(kind="interactive", requests=2), _rec(kind="batch", prompt_tokens=7)])
    store.record([_rec(kind="batch", adapter="acme/sql", completion_tokens=1)])
    assert store.query(group_by="adapter") == [
        {
            "tenant": "acme",
            "adapter": "acme/sql",
            "interactive": dict.fromkeys(COUNTS, 0),
            "batch": {
                "requests": 1,
                "prompt_tokens": 10,
                "cached_tokens": 2,
                "completion_tokens": 1,
            },
            "last_used": MINUTE,
        },
        {
            "tenant": "acme",
            "adapter": "base",
            "interactive": {
                "requests": 2,
                "prompt_tokens": 10,
                "cached_tokens": 2,
                "completion_tokens": 5,
            },
            "batch": {
                "requests": 1,
                "prompt_tokens": 7,
                "cached_tokens": 2,
                "completion_tokens": 5,
            },
            "last_used": MINUTE,
        },
    ]


def test_rows_are_aggregated_by_the_minute(store, tmp_path):
    store.record([_rec(time=T0 + i * 0.5) for i in range(100)])  # 50 s: one minute
    store.record([_rec(time=T0 + 61)])
    with sqlite3.connect(tmp_path / "usage.db") as db:
        assert db.execute("SELECT COUNT(*), SUM(requests) FROM usage").fetchone() == (2, 101)


def test_usage_survives_a_restart(tmp_path):
    url = f"sqlite:///{tmp_path}/state/usage.db"  # the folder is created
    records = _random_records(random.Random(3), 50)
    first = UsageStore(url)
    first.record(records)
    first.close()
    first.close()  # twice is harmless
    again = UsageStore(url)
    again.record(records[:1])
    assert again.query(group_by="key") == _expected([*records, records[0]], "key")
    again.close()


def test_in_memory_stores_are_private():
    a, b = UsageStore("sqlite:///:memory:"), UsageStore("sqlite:///:memory:")
    a.record([_rec()])
    assert a.totals()["interactive"]["requests"] == 1
    assert b.query() == []
    assert b.totals() == {k: dict.fromkeys(COUNTS, 0) for k in KINDS}


def test_empty_record_list_is_a_no_op(store):
    store.record([])
    assert store.query() == []


def test_bad_group_by_names_the_allowed_values(store):
    with pytest.raises(ValueError, match="group_by must be one of adapter, key, day, tenant"):
        store.query(group_by="model")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "stream"}, "usage kind must be one of interactive, batch, got 'stream'"),
        ({"prompt_tokens": -1}, "usage prompt_tokens must be an integer >= 0, got -1"),
        ({"completion_tokens": 1.5}, "usage completion_tokens must be an integer >= 0"),
        ({"requests": 0}, None),
    ],
)
def test_records_are_checked(change, message):
    if message is None:
        assert _rec(**change).requests == 0  # a record of tokens alone is allowed
        return
    with pytest.raises(ValueError, match=message):
        _rec(**change)


def test_only_sqlite_urls_are_accepted():
    with pytest.raises(ValueError, match="is not a sqlite:///<path> URL"):
        UsageStore("postgresql://db/usage")


def test_a_folder_is_not_a_usage_store(tmp_path):
    with pytest.raises(UsageStoreError, match=f"usage store {tmp_path}: cannot open it"):
        UsageStore(f"sqlite:///{tmp_path}")


def test_a_file_that_is_not_a_database_is_named(tmp_path):
    path = tmp_path / "usage.db"
    path.write_bytes(b"not a database, just text " * 100)
    with pytest.raises(UsageStoreError, match=f"usage store {path}: cannot open it: .*not a data"):
        UsageStore(f"sqlite:///{path}")


def test_a_store_under_a_file_is_named(tmp_path):
    (tmp_path / "plain").write_text("x")
    path = tmp_path / "plain" / "usage.db"
    with pytest.raises(UsageStoreError, match=f"usage store {path}: cannot open it"):
        UsageStore(f"sqlite:///{path}")


def test_last_used_is_the_latest_minute_in_range(store):
    store.record([_rec(time=T0), _rec(time=T0 + 150), _rec(adapter="acme/sql", time=T0 + 61)])
    rows = {r["adapter"]: r["last_used"] for r in store.query(group_by="adapter")}
    assert rows == {"base": MINUTE + 120, "acme/sql": MINUTE + 60}
    before = store.query(group_by="adapter", end=T0 + 120)
    assert {r["adapter"]: r["last_used"] for r in before} == {
        "base": MINUTE,
        "acme/sql": MINUTE + 60,
    }
