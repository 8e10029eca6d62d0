"""The registry as a shared catalogue over HTTP: a tenant's adapter quotas, concurrent creates
of one name (one winner, one clean 409), a corrupt entry that breaks nobody's listing, and a
failing backend answered 503 without its paths."""

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from adapters.registry import publishing
from serving.api.core import adapter_upload, quotas
from serving.api.core.caller import Principal, key_id
from serving.api.core.errors import ApiError
from serving.api.core.quotas import Holdings, check_quota, holdings
from tests.serving.api.served import ACME, ADMIN, GLOBEX, KEYS, serve

SECOND_ACME = "acme-key-second"
LIMITS = {"acme": {"max_adapters": 2}}


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def upload(served, key, name, source):
    adapter = served.world.adapters[served.world.versions[source]]
    files = {
        "adapter_config.json": ("adapter_config.json", adapter.config_bytes),
        "adapter_model.safetensors": ("adapter_model.safetensors", adapter.weights_bytes),
    }
    return httpx.post(f"{served.url}/v1/adapters", data={"name": name}, files=files,
                      headers=auth(key), timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    keys = {**KEYS, SECOND_ACME: Principal("acme", "user", key_id(SECOND_ACME))}
    root = tmp_path_factory.mktemp("catalogue")
    with serve(world, root, keys=keys, publish=(), limits_of=lambda t: LIMITS.get(t, {})) as s:
        yield s


def test_a_tenant_owns_at_most_max_adapters(served):
    assert upload(served, ACME, "one", "qk").status_code == 201
    assert upload(served, ACME, "two", "ov").status_code == 201
    r = upload(served, ACME, "three", "down")
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    assert "at most 2 adapter(s)" in r.json()["error"]["message"]
    assert not served.registry.exists("three", "acme")
    assert upload(served, ACME, "two", "down").status_code == 201  # a new version: no new name
    assert upload(served, GLOBEX, "three", "down").status_code == 201  # globex has no limit
    assert httpx.delete(f"{served.url}/v1/adapters/one", headers=auth(ACME)).status_code == 200
    assert upload(served, ACME, "three", "down").status_code == 201


def test_adapter_storage_counts_every_stored_version():
    mb = 2**20
    held = Holdings(frozenset({"a", "b"}), {"d1": int(0.75 * mb), "d2": int(0.5 * mb)})
    check_quota(held, "c", "d3", int(0.75 * mb), {"max_adapter_mb": 2})  # 2.0 MB: fits exactly
    with pytest.raises(ApiError) as info:
        check_quota(held, "c", "d3", int(0.76 * mb), {"max_adapter_mb": 2})
    assert info.value.status == 429 and "above its limit of 2 MB" in info.value.message
    # a new version of "a" adds to what is stored: the old one stays in its history
    with pytest.raises(ApiError):
        check_quota(held, "a", "d4", int(0.76 * mb), {"max_adapter_mb": 2})
    # content the tenant already stores takes no more space
    check_quota(held, "c", "d1", int(0.75 * mb), {"max_adapter_mb": 1.25})
    check_quota(held, "c", "d3", 10 * mb, {})


def test_reuploads_count_against_storage(served, monkeypatch):
    def size(source):
        return served.world.adapters[served.world.versions[source]].num_bytes

    used = sum(holdings(served.registry, "globex").sizes.values())
    # a limit of 1 "MB" that holds what globex stores and one more version, not two
    monkeypatch.setitem(LIMITS, "globex", {"max_adapter_mb": 1})
    monkeypatch.setattr("serving.api.core.quotas.MB", used + max(size("qk"), size("ov")))
    assert upload(served, GLOBEX, "quota-a", "qk").status_code == 201
    r = upload(served, GLOBEX, "quota-a", "ov")  # a second version of the same name
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    assert upload(served, GLOBEX, "quota-a", "qk").status_code == 201  # stored already
    assert (
        httpx.delete(f"{served.url}/v1/adapters/quota-a", headers=auth(GLOBEX)).status_code == 200
    )
    assert upload(served, GLOBEX, "quota-b", "ov").status_code == 201  # deleting freed it


def test_concurrent_uploads_never_take_a_tenant_past_max_adapters(served, monkeypatch):
    """Eight uploads of new names at once with one slot left: exactly one lands."""
    owned = holdings(served.registry, "globex").names
    monkeypatch.setitem(LIMITS, "globex", {"max_adapters": len(owned) + 1})
    answers = {}

    def go(i):
        answers[i] = upload(served, GLOBEX, f"burst-{i}", ("qk", "ov")[i % 2])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [201] + [429] * 7, [r.text for r in answers.values()]
    assert len(holdings(served.registry, "globex").names) == len(owned) + 1
    # The lock is the tenant's while writes hold or wait for it, and goes with the last one.
    assert "globex" not in quotas._locks


def test_concurrent_creates_of_one_name_end_with_one_winner_and_a_409(served, monkeypatch):
    """Two API processes (each its own tenant lock) create one name at once: the registry's
    own claim lets one win and answers the other a clean 409."""
    monkeypatch.setattr(adapter_upload, "tenant_lock", lambda tenant: threading.Lock())
    looked = threading.Barrier(2, timeout=30)
    real = publishing.store_version

    def store_after_both_looked(*args, **kwargs):
        looked.wait()  # both publishes saw no such name before either claims it
        return real(*args, **kwargs)

    monkeypatch.setattr(publishing, "store_version", store_after_both_looked)
    answers = {}

    def go(key, source):
        answers[key] = upload(served, key, "race", source)

    # one tenant, two keys
    threads = [threading.Thread(target=go, args=a) for a in ((ACME, "qk"), (SECOND_ACME, "ov"))]
    LIMITS["acme"] = {}
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        LIMITS["acme"] = {"max_adapters": 2}
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [201, 409], [r.text for r in answers.values()]
    loser = next(r for r in answers.values() if r.status_code == 409)
    assert (
        loser.json()["error"]["code"] == "conflict" and "race" in loser.json()["error"]["message"]
    )
    winner = next(r for r in answers.values() if r.status_code == 201)
    assert served.registry.resolve("race", "acme").digest == winner.json()["digest"]


def test_a_corrupt_entry_breaks_no_listing(served):
    assert upload(served, GLOBEX, "fine", "qk").status_code == 201
    assert upload(served, GLOBEX, "broken", "ov").status_code == 201
    root = Path(served.registry.uri.removeprefix("file://"))
    (root / "tenants/globex/names/broken/latest.json").write_text("{not json")
    before = skipped(served)
    r = httpx.get(f"{served.url}/v1/adapters", headers=auth(GLOBEX))
    assert r.status_code == 200
    assert "fine" in [a["name"] for a in r.json()["data"]]
    assert "broken" not in [a["name"] for a in r.json()["data"]]
    assert httpx.get(f"{served.url}/v1/models", headers=auth(ACME)).status_code == 200
    assert skipped(served) > before
    # re-uploading the same content repairs the name
    assert upload(served, GLOBEX, "broken", "ov").status_code == 201
    names = [a["name"] for a in httpx.get(f"{served.url}/v1/adapters", headers=auth(GLOBEX))
             .json()["data"]]  # fmt: skip
    assert "broken" in names


def skipped(served):
    text = httpx.get(f"{served.url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("loraserve_registry_skipped_entries"))
    return float(line.split()[-1])


def test_a_failing_backend_is_503_without_paths(served, monkeypatch):
    fs = served.registry._store.fs

    def fail(*args, **kwargs):
        raise OSError(5, "Input/output error", "/srv/secret/registry/tenants")

    for method in ("cat_file", "ls", "exists", "pipe_file"):
        monkeypatch.setattr(fs, method, fail)
    for r in (
        httpx.get(f"{served.url}/v1/adapters", headers=auth(ACME)),
        httpx.get(f"{served.url}/v1/models", headers=auth(ACME)),
        httpx.get(f"{served.url}/v1/adapters/two", headers=auth(ACME)),
        httpx.post(
            f"{served.url}/v1/completions",
            headers=auth(ACME),
            json={"model": "two", "prompt": "x", "max_tokens": 1},
        ),
        upload(served, ACME, "two", "qk"),
    ):
        assert r.status_code == 503, r.text
        assert "secret" not in r.text and "/srv" not in r.text
        assert "registry cannot be reached" in r.json()["error"]["message"]


def test_a_damaged_version_is_a_500_without_paths_until_uploaded_again(served):
    assert upload(served, GLOBEX, "damaged", "mlp").status_code == 201
    digest = served.world.versions["mlp"].split("@")[1]
    root = Path(served.registry.uri.removeprefix("file://"))
    meta = root / "versions" / digest / "meta.json"
    good = meta.read_bytes()
    meta.write_text("[]")
    body = {"prompt": "x", "raw": True, "lora": "damaged", "max_tokens": 1}
    r = httpx.post(f"{served.url}/ai/run/demo", json=body, headers=auth(GLOBEX))
    assert r.status_code == 500 and str(root) not in r.text
    assert "upload" in r.json()["errors"][0]["message"]
    assert upload(served, GLOBEX, "damaged", "mlp").status_code == 201  # repairs it
    assert meta.read_bytes() != b"[]" and good
    assert (
        httpx.post(f"{served.url}/ai/run/demo", json=body, headers=auth(GLOBEX)).status_code == 200
    )


def test_an_upload_tells_when_its_own_name_moved_not_when_another_stored_the_bytes(served):
    """Versions are stored once by content: the answer's `created` must not tell a tenant that
    (and when) another tenant uploaded the same files."""
    first = upload(served, GLOBEX, "same-bytes", "down")
    assert first.status_code == 201
    time.sleep(1.1)
    began = datetime.now(UTC) - timedelta(milliseconds=5)
    second = upload(served, ADMIN, "same-bytes", "down")  # the admin key's own tenant
    assert second.status_code == 201 and second.json()["digest"] == first.json()["digest"]
    assert datetime.fromisoformat(second.json()["created"]) >= began
