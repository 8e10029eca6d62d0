"""Adapters managed through GET /dashboard in a real chromium against a real server: Delete
is offered only where the key may delete, uploads and deletes go through the API (a refused
upload shows its message verbatim), and a keyless server's own page may do both."""

import httpx
import pytest

from tests.serving.api.admin.test_dashboard import REFUSED, adapter_folder, auth, complete
from tests.serving.api.browser import dashboard, row_names
from tests.serving.api.served import ACME, ADMIN, serve


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("dashboard-adapters")) as s:
        yield s


def test_delete_is_offered_only_where_the_key_may_delete(world, tmp_path, browser):
    # A server of its own: globex's public adapter would be in every other test's listings.
    with serve(world, tmp_path, limits_of=lambda t: {"requests_per_minute": 30}) as served:
        served.registry.publish("qk", world.adapters[world.versions["qk"]], "globex")
        served.registry.set_public("qk", "globex", True)
        own = {"upper", "rot13", "mlp"}
        for key, deletable in ((ACME, own), (ADMIN, own | {"qk"})):
            with dashboard(browser, served.url, key) as (page, watch):
                page.wait_for_selector('#adapters tr[data-adapter="upper"] button')
                assert "qk" in row_names(page)  # listed: public, usable by every tenant
                offered = "rows => rows.map(r => r.dataset.adapter)"
                assert (
                    set(page.eval_on_selector_all("#adapters tr:has(button)", offered)) == deletable
                )
                page.wait_for_selector("#usage dl")  # each last-minute figure names its window
                text = page.inner_text("#usage")
                assert "Requests, last 60 s" in text and "Tokens since " in text, text
                assert watch.errors == []


def test_upload_then_delete_through_the_page(served, browser, tmp_path):
    folder = adapter_folder(served, tmp_path / "fresh", "ov")
    with dashboard(browser, served.url, ACME) as (page, watch):
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        page.set_input_files("#upload-folder", folder)
        page.fill("#upload-name", "fresh")
        page.click("#upload-submit")
        page.wait_for_selector("#upload-status.ok >> text=Uploaded fresh")
        assert page.eval_on_selector("#upload-progress", "p => p.value") == 1
        page.wait_for_selector('#adapters tr[data-adapter="fresh"]')
        answer = complete(served, "fresh")
        assert answer.status_code == 200
        assert isinstance(answer.json()["choices"][0]["text"], str)

        # Escape closes the dialog and deletes nothing; Delete in the dialog deletes.
        page.click('#adapters tr[data-adapter="fresh"] button')
        page.wait_for_selector("#confirm-dialog[open]")
        assert page.evaluate("document.activeElement.id") == "confirm-no"
        page.keyboard.press("Escape")
        page.wait_for_selector("#confirm-dialog:not([open])", state="attached")
        assert served.registry.exists("fresh", "acme")
        page.click('#adapters tr[data-adapter="fresh"] button')
        page.click("#confirm-yes")
        page.wait_for_selector('#adapters tr[data-adapter="fresh"]', state="detached")
        assert watch.errors == []
    listed = httpx.get(f"{served.url}/v1/adapters", headers=auth(ACME), timeout=10).json()
    assert "fresh" not in {a["name"] for a in listed["data"]}
    assert complete(served, "fresh").status_code == 404


def test_a_refused_upload_shows_the_apis_message_verbatim(served, browser, tmp_path):
    folder = adapter_folder(served, tmp_path / "broken", "ov", config=b'{"r": 4,')
    files = {name: (name, (folder / name).read_bytes())
             for name in ("adapter_config.json", "adapter_model.safetensors")}  # fmt: skip
    expected = httpx.post(f"{served.url}/v1/adapters", data={"name": "broken"}, files=files,
                          headers=auth(ACME), timeout=30)  # fmt: skip
    assert expected.status_code == 400
    with dashboard(browser, served.url, ACME) as (page, watch):
        page.fill("#upload-name", "broken")
        page.set_input_files("#upload-config", folder / "adapter_config.json")
        page.set_input_files("#upload-weights", folder / "adapter_model.safetensors")
        page.click("#upload-submit")
        page.wait_for_selector("#upload-status.error")
        assert page.text_content("#upload-status") == expected.json()["error"]["message"]
        assert all(REFUSED.match(e) for e in watch.errors), watch.errors
    assert not served.registry.exists("broken", "acme")


def test_a_keyless_server_connects_without_asking(world, tmp_path, browser):
    # nothing typed, no Connect pressed: a server with no keys has nothing to ask for
    with serve(world, tmp_path, keys={}) as served, dashboard(browser, served.url, None) as (
        page, watch,
    ):  # fmt: skip
        assert page.get_attribute("html", "data-keyless") == "true"
        page.wait_for_selector('#adapters tr[data-adapter="upper"]')
        page.wait_for_selector("#chart-load svg")
        page.wait_for_selector("#usage dl, #usage p.note")
        # the page's own uploads and deletes pass the gate: they come from its own origin
        page.set_input_files("#upload-folder", adapter_folder(served, tmp_path / "mine", "ov"))
        page.fill("#upload-name", "mine")
        page.click("#upload-submit")
        page.wait_for_selector("#upload-status.ok >> text=Uploaded mine")
        assert served.registry.exists("mine", "default")
        page.click('#adapters tr[data-adapter="mine"] button')
        page.click("#confirm-yes")
        page.wait_for_selector('#adapters tr[data-adapter="mine"]', state="detached")
        assert not served.registry.exists("mine", "default")
        assert watch.errors == []
