"""GET /dashboard in a real chromium against a real server: the page loads cleanly and asks
nothing of any other host, shows each key its own adapters, draws live figures, and fits a
desk and a phone. Adapters managed through the page: test_dashboard_adapters.py."""

import re
import threading

import httpx
import pytest

from serving.api.admin.routes_dashboard import ASSETS
from tests.serving.api.browser import (
    DESK,
    PHONE,
    TIMEOUT_MS,
    artifacts_dir,
    dashboard,
    latest,
    row_names,
)
from tests.serving.api.served import ACME, GLOBEX, serve
from tests.serving.batch.openai_batch import chat, client, line, start

# The one error chromium logs for an answer the test provoked on purpose (a refused upload).
REFUSED = re.compile(r"^Failed to load resource: the server responded with a status of 400\b")


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def complete(served, model, key=ACME):
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{served.url}/v1/completions", json=body, headers=auth(key), timeout=60)


def adapter_folder(served, folder, source, config=None):
    """A PEFT adapter folder holding the world's adapter `source` (config: other bytes)."""
    adapter = served.world.adapters[served.world.versions[source]]
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_bytes(config or adapter.config_bytes)
    (folder / "adapter_model.safetensors").write_bytes(adapter.weights_bytes)
    return folder


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("dashboard")) as s:
        s.registry.publish("qk", world.adapters[world.versions["qk"]], "globex")
        yield s


def test_page_and_assets_need_no_key_and_name_no_other_host(served):
    page = httpx.get(f"{served.url}/dashboard", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page.text)
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "data-keyless" not in page.text  # a keyed server's page asks for a key
    for asset, kind in ASSETS.items():
        r = httpx.get(f"{served.url}/dashboard/{asset}", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == kind, asset
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", r.text), asset
    for missing in ("nope.js", "index.htm", "..%2Froutes_dashboard.py", "%2E%2E"):
        r = httpx.get(f"{served.url}/dashboard/{missing}", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["message"], missing
    schema = httpx.get(f"{served.url}/openapi.json", timeout=10).json()
    assert "/dashboard/{asset}" not in schema["paths"]


def test_the_live_chart_follows_requests(world, tmp_path, browser):
    # A server of its own: no earlier test's requests are inside its rate window.
    with serve(world, tmp_path) as served, dashboard(browser, served.url, ACME) as (page, watch):
        page.wait_for_selector("#chart-tokens svg")
        assert latest(page, "chart-tokens")["tokens_per_s"] in (None, 0)
        for _ in range(3):
            assert complete(served, "upper").status_code == 200
        page.wait_for_function(
            "() => JSON.parse(document.getElementById('chart-tokens').dataset.latest)"
            ".tokens_per_s > 0", timeout=TIMEOUT_MS,
        )  # fmt: skip
        assert latest(page, "chart-tokens")["tokens_per_s"] > 0
        assert "acme/upper" in latest(page, "chart-top")["values"]
        # the adapters table takes its last-hour figures from the same answers
        page.wait_for_function(
            "() => Number(document.querySelector('#adapters tr[data-adapter=\"upper\"]')"
            ".cells[10].textContent) >= 3"
        )  # fmt: skip
        assert "NaN" not in page.inner_text("main")
        assert watch.errors == []


def test_the_page_loads_cleanly_and_asks_only_its_server(served, browser):
    with dashboard(browser, served.url, ACME) as (page, watch):
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        page.wait_for_selector("#chart-tokens svg")
        page.wait_for_selector("#usage dl")
        page.wait_for_timeout(2500)  # one more poll of each kind, errors included
        assert watch.errors == []
        assert watch.requests and watch.foreign(served.url) == []
        assert {"/v1/adapters", "/v1/stats", "/v1/batches"} <= {
            httpx.URL(u).path for u in watch.requests
        }
        assert page.evaluate("sessionStorage.getItem('loraserve.key')") == ACME
        page.reload()  # the tab keeps its key: the page connects again by itself
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        assert page.input_value("#api-key") == ACME
        page.keyboard.press("Tab")  # the first stop is the skip link, for keyboard users
        assert page.evaluate("document.activeElement.className") == "skip"
        assert "NaN" not in page.inner_text("main")
        page.click("#forget")
        page.wait_for_selector("#adapters tr[data-adapter]", state="detached")
        assert page.evaluate("sessionStorage.getItem('loraserve.key')") is None


def test_keyboard_focus_survives_polls_and_the_dialog(served, browser):
    upper = '#adapters tr[data-adapter="upper"]'
    focused_row = "document.activeElement.closest('tr')?.dataset.adapter"
    with dashboard(browser, served.url, ACME) as (page, watch):
        before = page.text_content(upper)
        page.focus(f"{upper} button")
        assert complete(served, "upper").status_code == 200
        # the row is drawn anew once its request counts change; the focus moves with it
        page.wait_for_function(
            "([sel, before]) => document.querySelector(sel).textContent !== before",
            arg=[upper, before],
        )
        assert page.evaluate(focused_row) == "upper"
        page.keyboard.press("Enter")
        page.wait_for_selector("#confirm-dialog[open]")
        page.keyboard.press("Escape")
        page.wait_for_selector("#confirm-dialog:not([open])", state="attached")
        assert page.evaluate(focused_row) == "upper"
        assert served.registry.exists("upper", "acme") and watch.errors == []


def test_each_key_sees_its_own_adapters(served, browser):
    with dashboard(browser, served.url, ACME) as (page, _):
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        assert {"upper", "rot13", "mlp"} <= row_names(page) and "qk" not in row_names(page)
        row = page.locator('#adapters tr[data-adapter="upper"]')
        digest = served.world.versions["upper"].split("@")[1]
        assert digest[:12] in row.inner_text() and "acme" in row.inner_text()
    with dashboard(browser, served.url, GLOBEX) as (page, watch):
        page.wait_for_selector('#adapters tr[data-adapter="qk"]')
        assert row_names(page) == {"qk"}
        assert watch.errors == []


def test_a_wrong_key_shows_the_apis_message(served, browser):
    with dashboard(browser, served.url, "not-a-key") as (page, _):
        page.wait_for_function(
            "() => document.getElementById('status').textContent.length > 0"
            " && document.getElementById('status').classList.contains('error')"
        )
        answer = httpx.get(f"{served.url}/v1/adapters", headers=auth("not-a-key"), timeout=10)
        assert answer.status_code == 401
        assert page.text_content("#status") == answer.json()["error"]["message"]


def test_markup_in_an_answer_stays_text(served, browser, tmp_path):
    folder = adapter_folder(served, tmp_path / "named", "ov")
    with dashboard(browser, served.url, ACME) as (page, _):
        page.fill("#upload-name", '<img src=x id="injected">')
        page.set_input_files("#upload-folder", folder)
        page.click("#upload-submit")
        page.wait_for_selector("#upload-status.error")
        assert "<img src=x" in page.text_content("#upload-status")
        assert page.locator("#injected").count() == 0


def test_a_running_batch_is_listed_and_cancelled_from_the_page(served, browser):
    model = served.generator.engine.model
    forward = model.forward
    # Holds every step until the page has cancelled, so the batch is still running whatever
    # the machine's speed (the deadline only bounds a failing test).
    acted = threading.Event()

    def held_forward(*args, **kwargs):
        acted.wait(timeout=120)
        return forward(*args, **kwargs)

    model.forward = held_forward
    try:
        c = client(served)
        batch = start(c, [line(f"b{i}", chat("upper", i, max_tokens=4)) for i in range(60)])
        with dashboard(browser, served.url, ACME) as (page, watch):
            row = page.locator(f'#batches tr[data-batch="{batch.id}"]')
            row.get_by_role("button", name=f"Cancel {batch.id}").click()
            page.wait_for_function(
                "id => /cancell/.test(document.querySelector(`#batches tr[data-batch='${id}']`)"
                ".cells[1].textContent)", arg=batch.id,
            )  # fmt: skip
            assert row.locator("progress").count() == 1 and "/60" in row.inner_text()
            assert watch.errors == []
        assert c.batches.retrieve(batch.id).status in ("cancelling", "cancelled")
    finally:
        model.forward = forward
        acted.set()


@pytest.mark.parametrize("name, viewport", [("desk", DESK), ("phone", PHONE)])
def test_screenshots_at_desk_and_phone_sizes(served, browser, name, viewport):
    complete(served, "upper")  # something to draw
    with dashboard(browser, served.url, ACME, viewport=viewport) as (page, watch):
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        page.wait_for_selector("#chart-top svg")
        page.wait_for_selector("#usage dl")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"] + 1
        path = artifacts_dir() / f"dashboard-{name}-{viewport['width']}x{viewport['height']}.png"
        page.screenshot(path=str(path), full_page=True, timeout=TIMEOUT_MS)
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert watch.errors == []
