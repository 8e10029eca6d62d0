"""Adapter memory on GET /dashboard in a real chromium against a real server: the memory
table shows the slab's and the host tier's bytes as the slab reports them, and the churn
chart and the table follow the loads that requests cause."""

import dataclasses

import httpx

from tests.serving.api.admin.test_dashboard import auth, complete
from tests.serving.api.browser import TIMEOUT_MS, dashboard, latest
from tests.serving.api.served import ACME, serve

MiB = 1 << 20
ROW = '#memory tr[data-replica="r1"]'
# the figures of a paged slab and a host tier with a byte budget
MEMORY = {"page_rank": 8, "pages": 16, "pages_used": 6, "slab_bytes": 16 * MiB,
          "slab_used_bytes": 6 * MiB, "host_bytes": 64 * MiB, "host_used_bytes": 40 * MiB,
          "host_entries": 2}  # fmt: skip
LATEST_LOADS = "JSON.parse(document.getElementById('chart-churn').dataset.latest).loads_per_s"


def test_memory_table_and_churn_chart(world, tmp_path, browser, monkeypatch):
    # A server of its own: no earlier test's loads are inside its rates' window.
    with serve(world, tmp_path) as served:
        slab = served.generator.engine.slab
        real = slab.stats  # its counters stay its own, whatever bytes the slab at hand reports
        monkeypatch.setattr(slab, "stats", lambda: dataclasses.replace(real(), **MEMORY))
        with dashboard(browser, served.url, ACME) as (page, watch):
            page.wait_for_selector(f"{ROW} meter")
            meters = page.eval_on_selector_all(
                f"{ROW} meter", "ms => ms.map(m => [m.value, m.max])"
            )
            assert meters == [[6 * MiB, 16 * MiB], [40 * MiB, 64 * MiB]]  # slab, host tier
            cells = page.eval_on_selector_all(
                f"{ROW} td", "cs => cs.map(c => c.textContent.trim())"
            )
            assert cells[:5] == ["6.0 MiB of 16.0 MiB", "10.0 MiB", "6 of 16 (8 rows each)",
                                 "40.0 MiB of 64.0 MiB", "2"]  # fmt: skip
            assert latest(page, "chart-churn")["loads_per_s"] in (None, 0)

            before = real().loads
            for model in ("upper", "rot13", "mlp"):
                assert complete(served, model).status_code == 200
            loaded = real().loads - before
            assert loaded >= 3  # each adapter loaded once at least
            page.wait_for_function(f"() => {LATEST_LOADS} > 0", timeout=TIMEOUT_MS)
            # read in one go: the chart and the table are drawn from the same answer
            rate, cell = page.evaluate(
                f"row => [{LATEST_LOADS}, document.querySelector(row).cells[6].textContent]", ROW
            )
            # no rate is taken over less than a second: it cannot pass the loads made
            assert 0 < rate <= loaded
            assert cell == f"{rate:.2f}".rstrip("0").rstrip(".") + "/s"
            stats = httpx.get(f"{served.url}/v1/stats", headers=auth(ACME), timeout=30).json()
            assert stats["summary"]["slab"]["loads"] == real().loads
            assert "NaN" not in page.inner_text("main")
            assert watch.errors == []
