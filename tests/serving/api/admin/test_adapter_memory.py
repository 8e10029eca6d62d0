"""/v1/stats' adapter memory: each replica's slab and host-tier bytes and pages as its slab
reports them, their sum over replicas, and loads and evictions per second that equal the
counters' rise between two looks over the seconds between them."""

import time

import httpx
import pytest

from serving.api.admin.stats import replica_figures, summary
from serving.api.core.slab_rates import SlabRates
from serving.engine.snapshot import EngineSnapshot
from tests.serving.api.served import ACME, serve
from tests.serving.api.slab_figures import slab_figures

MiB = 1 << 20


def figures(replica: str, **slab) -> EngineSnapshot:
    return EngineSnapshot(
        replica, 0, 0, 0.0, 0.0, 0, 0, 0, slab=slab_figures(**slab) if slab else {}
    )


def everyone(_):
    return True


def test_memory_per_replica_and_summed():
    budgeted = figures(
        "r0", page_rank=8, pages=64, pages_used=10, slab_bytes=64 * MiB, slab_used_bytes=10 * MiB,
        host_bytes=100 * MiB, host_used_bytes=30 * MiB, host_entries=3, resident=4, loads=12,
        registry_hits=5, evictions=4, host_evictions=1,
    )  # fmt: skip
    unbudgeted = figures(
        "r1", page_rank=8, pages=32, pages_used=32, slab_bytes=32 * MiB, slab_used_bytes=32 * MiB,
        host_used_bytes=2 * MiB, host_entries=2, resident=2, loads=7, evictions=5,
    )  # fmt: skip
    bare = figures("r2")  # serves no adapters
    every = [budgeted, unbudgeted, bare]
    rates = {"r0": {"loads_per_s": 0.5, "evictions_per_s": 0.25, "registry_loads_per_s": 0.1,
                    "host_evictions_per_s": 0.0, "rates_over_s": 30.0}}  # fmt: skip

    r0 = replica_figures(budgeted, [], 30, everyone, everyone, rates)
    assert r0["slab"] == {
        "page_rank": 8, "pages": 64, "pages_used": 10, "bytes": 64 * MiB,
        "used_bytes": 10 * MiB, "free_bytes": 54 * MiB, "resident": 4, "loads": 12,
        "registry_loads": 5, "evictions": 4, "loads_per_s": 0.5, "registry_loads_per_s": 0.1,
        "evictions_per_s": 0.25, "rates_over_s": 30.0,
    }  # fmt: skip
    assert r0["host_tier"] == {"budget_bytes": 100 * MiB, "used_bytes": 30 * MiB,
                               "free_bytes": 70 * MiB, "entries": 3, "evictions": 1,
                               "evictions_per_s": 0.0}  # fmt: skip
    assert (r0["slab_slots"], r0["slab_used"]) == (64, 4)  # pages; adapters resident
    r1 = replica_figures(unbudgeted, [], 30, everyone, everyone, rates)
    assert r1["host_tier"]["budget_bytes"] is None and r1["host_tier"]["free_bytes"] is None
    assert r1["slab"]["free_bytes"] == 0 and r1["slab"]["loads_per_s"] is None  # no look yet
    r2 = replica_figures(bare, [], 30, everyone, everyone, rates)
    assert r2["slab"] is None and r2["host_tier"] is None

    total = summary(every, [], 30, everyone, everyone, rates)
    assert total["slab"] == {
        "pages": 96, "pages_used": 42, "bytes": 96 * MiB, "used_bytes": 42 * MiB,
        "free_bytes": 54 * MiB, "resident": 6, "loads": 19, "registry_loads": 5,
        "evictions": 9, "loads_per_s": 0.5, "registry_loads_per_s": 0.1,
        "evictions_per_s": 0.25,
    }  # fmt: skip
    # r1 keeps no byte budget, so the sum has none either; what is held still adds up
    assert total["host_tier"] == {"budget_bytes": None, "used_bytes": 32 * MiB,
                                  "free_bytes": None, "entries": 5, "evictions": 1,
                                  "evictions_per_s": 0.0}  # fmt: skip
    assert summary([bare], [], 30, everyone, everyone)["slab"] is None


def test_rates_are_the_rise_since_the_base_look():
    clock = [1000.0]
    rates = SlabRates(window_s=30, clock=lambda: clock[0])

    def look(at: float, replica="r0", **counts):
        clock[0] = 1000.0 + at
        return rates.update([figures(replica, pages=4, **counts)]).get(replica)

    first = look(0, loads=5)
    assert first["loads_per_s"] is None and first["rates_over_s"] is None
    assert look(0.5, loads=6)["loads_per_s"] is None  # under a second: no rate, not kept
    got = look(2, loads=9, evictions=1, registry_hits=2, host_evictions=1)
    assert got == {"loads_per_s": 2.0, "evictions_per_s": 0.5, "registry_loads_per_s": 1.0,
                   "host_evictions_per_s": 0.5, "rates_over_s": 2.0}  # fmt: skip
    # a poll every 2 s: once 30 s have passed the base is the look 30 s before
    loads = {0: 5, 2: 9}
    for at in range(4, 41, 2):
        loads[at] = loads[at - 2] + (3 if at <= 20 else 0)  # 1.5/s until 20 s, then none
        got = look(at, loads=loads[at], evictions=1, registry_hits=2, host_evictions=1)
    assert got["rates_over_s"] == 30.0
    assert got["loads_per_s"] == pytest.approx((loads[40] - loads[10]) / 30)
    # sparse polls: the rate since the previous look, however long ago
    got = look(100, loads=loads[40] + 12, evictions=1, registry_hits=2, host_evictions=1)
    assert got["rates_over_s"] == 60.0 and got["loads_per_s"] == pytest.approx(12 / 60)
    # figures taken before the newest look but answered after it: rated, never a base
    look(110, loads=loads[40] + 20, evictions=2, registry_hits=2, host_evictions=1)
    late = look(112, loads=loads[40] + 15, evictions=1, registry_hits=2, host_evictions=1)
    assert late["loads_per_s"] == pytest.approx(15 / 72)  # against the look at 40 s
    after = look(143, loads=loads[40] + 23, evictions=2, registry_hits=2, host_evictions=1)
    assert after["rates_over_s"] == 33.0  # the base is the look at 110 s, not the late one
    assert after["loads_per_s"] == pytest.approx(3 / 33)
    # counters below the base's: a slab built anew under the same name starts afresh
    assert look(150, loads=1)["loads_per_s"] is None
    assert look(152, loads=3)["loads_per_s"] == 1.0
    # a replica that leaves is forgotten; back, it has no base
    assert look(154, replica="r9", loads=0)["loads_per_s"] is None
    assert look(156, loads=9)["loads_per_s"] is None


def test_a_real_servers_memory_and_rates(world, tmp_path):
    # A server of its own: its looks start with this test's.
    with serve(world, tmp_path) as served:
        slab = served.generator.engine.slab

        def look():
            r = httpx.get(f"{served.url}/v1/stats", headers={"Authorization": f"Bearer {ACME}"},
                          timeout=30)  # fmt: skip
            assert r.status_code == 200, r.text
            return r.json(), slab.stats()

        t0 = time.monotonic()  # before the first look: the server's span lies within
        first, before = look()
        assert first["replicas"][0]["slab"]["loads_per_s"] is None  # one look: no rate
        time.sleep(1.1)
        for model in ("upper", "rot13", "mlp"):
            body = {"model": model, "prompt": "load me", "max_tokens": 2, "temperature": 0}
            r = httpx.post(f"{served.url}/v1/completions", json=body,
                           headers={"Authorization": f"Bearer {ACME}"}, timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
        second, after = look()
        elapsed = time.monotonic() - t0
        replica = second["replicas"][0]
        mine = replica["slab"]
        assert after.loads >= before.loads + 3  # each adapter loaded once at least
        assert 1.0 <= mine["rates_over_s"] <= elapsed
        assert mine["loads_per_s"] * mine["rates_over_s"] == pytest.approx(
            mine["loads"] - first["replicas"][0]["slab"]["loads"]
        )
        assert mine["loads"] == after.loads and mine["evictions"] == after.evictions
        # the bytes and pages are the slab's own, as it reports them
        assert (mine["bytes"], mine["used_bytes"], mine["pages"], mine["page_rank"]) == (
            after.slab_bytes,
            after.slab_used_bytes,
            after.pages,
            after.page_rank,
        )
        host = replica["host_tier"]
        assert (host["used_bytes"], host["entries"]) == (after.host_used_bytes,
                                                         after.host_entries)  # fmt: skip
        assert second["summary"]["slab"]["loads"] == mine["loads"]
        assert second["summary"]["slab"]["loads_per_s"] == mine["loads_per_s"]
