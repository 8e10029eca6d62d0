"""Tenants over HTTP: each tenant's adapters stay its own by every route and id form, names
are per tenant, and public adapters are usable by all but changed only by owner or admin."""

import json

import httpx
import pytest

from adapters.registry.names import OPERATOR
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve

PROMPT = "tenant test"


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def upload(served, key, name, source, **form):
    adapter = served.world.adapters[served.world.versions[source]]
    files = {
        "adapter_config.json": ("adapter_config.json", adapter.config_bytes),
        "adapter_model.safetensors": ("adapter_model.safetensors", adapter.weights_bytes),
    }
    return httpx.post(
        f"{served.url}/v1/adapters", data={"name": name, **form}, files=files,
        headers=auth(key), timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    # "upper" is the operator's public preload; acme and globex upload their own below
    with serve(world, tmp_path_factory.mktemp("tenants"), publish=("upper",), owner=OPERATOR) as s:
        for key, name, source in (
            (ACME, "support-bot", "qk"),
            (ACME, "acme-only", "ov"),
            (GLOBEX, "support-bot", "down"),
        ):
            r = upload(s, key, name, source)
            assert r.status_code == 201, r.text
        yield s


def digest(served, source):
    return served.world.versions[source].split("@")[1]


def want(served, source):
    ids = served.text_ids(PROMPT)
    return served.reference(ids, source, 5)[1] if source else served.reference(ids, None, 5)[1]


def openai(served, key, model, **extra):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, **extra}
    return httpx.post(f"{served.url}/v1/completions", json=body, headers=auth(key), timeout=60)


def workers(served, key, lora):
    body = {"prompt": PROMPT, "raw": True, "lora": lora, "max_tokens": 5, "temperature": 0}
    return httpx.post(f"{served.url}/ai/run/{MODEL_ID}", json=body, headers=auth(key), timeout=60)


def shape(r, name):
    """What a client can tell from an answer, the adapter's name blanked out."""
    return r.status_code, r.headers.get("content-type"), r.text.replace(name, "NAME")


def test_each_tenant_uses_its_own_adapter_of_one_name(served):
    for key, source in ((ACME, "qk"), (GLOBEX, "down")):
        assert openai(served, key, "support-bot").json()["choices"][0]["text"] == want(
            served, source
        )
        r = workers(served, key, f"{MODEL_ID}:support-bot")
        assert r.json()["result"]["response"] == want(served, source)
        pinned = workers(served, key, f"support-bot@{digest(served, source)}")
        assert pinned.status_code == 200, pinned.text
    # a tenant cannot reach the other's version by pinning its digest under its own name
    theirs = workers(served, GLOBEX, f"support-bot@{digest(served, 'qk')}")
    nobodys = workers(served, GLOBEX, f"support-bot@{'0' * 64}")
    assert theirs.status_code == 404
    assert shape(theirs, digest(served, "qk")) == shape(nobodys, "0" * 64)


GENERATION_ROUTES = {
    "openai model": lambda s, k, n: openai(s, k, n),
    "openai base:model": lambda s, k, n: openai(s, k, f"{MODEL_ID}:{n}"),
    "openai lora field": lambda s, k, n: openai(s, k, MODEL_ID, lora=n),
    "workers lora": lambda s, k, n: workers(s, k, n),
    "workers base:lora": lambda s, k, n: workers(s, k, f"{MODEL_ID}:{n}"),
    "workers lora@digest": lambda s, k, n: workers(s, k, f"{n}@{digest(s, 'ov')}"),
    "show": lambda s, k, n: httpx.get(f"{s.url}/v1/adapters/{n}", headers=auth(k)),
    "delete": lambda s, k, n: httpx.delete(f"{s.url}/v1/adapters/{n}", headers=auth(k)),
    "mark public": lambda s, k, n: httpx.patch(
        f"{s.url}/v1/adapters/{n}", json={"public": True}, headers=auth(k)
    ),
}


@pytest.mark.parametrize("route", sorted(GENERATION_ROUTES))
def test_another_tenants_adapter_is_missing_by_every_route(served, route):
    ask = GENERATION_ROUTES[route]
    hidden = ask(served, GLOBEX, "acme-only")
    missing = ask(served, GLOBEX, "acme-nothing")
    assert hidden.status_code == 404, hidden.text
    assert shape(hidden, "acme-only") == shape(missing, "acme-nothing")
    assert served.registry.exists("acme-only", "acme")  # nothing changed for its owner
    assert openai(served, ACME, "acme-only").json()["choices"][0]["text"] == want(served, "ov")


def test_listings_show_own_and_public_adapters_only(served):
    def names(key, path):
        data = httpx.get(f"{served.url}{path}", headers=auth(key)).json()["data"]
        return sorted((d.get("name") or d["id"], d.get("owner", d.get("owned_by"))) for d in data)

    assert names(GLOBEX, "/v1/adapters") == [("support-bot", "globex"), ("upper", OPERATOR)]
    assert names(ACME, "/v1/adapters") == [
        ("acme-only", "acme"), ("support-bot", "acme"), ("upper", OPERATOR)
    ]  # fmt: skip
    models = names(GLOBEX, "/v1/models")
    assert models == sorted(
        [(MODEL_ID, "loraserve"), (f"{MODEL_ID}:support-bot", "globex"),
         (f"{MODEL_ID}:upper", OPERATOR)]
    )  # fmt: skip
    everyone = names(ADMIN, "/v1/adapters")
    assert ("acme-only", "acme") in everyone and ("support-bot", "globex") in everyone
    only = httpx.get(f"{served.url}/v1/adapters?tenant=globex", headers=auth(ADMIN)).json()
    assert [(d["name"], d["owner"]) for d in only["data"]] == [("support-bot", "globex")]
    r = httpx.get(f"{served.url}/v1/adapters?tenant=acme", headers=auth(GLOBEX))
    assert r.status_code == 403


def test_public_adapters_are_used_by_all_and_changed_by_owner_or_admin(served):
    assert upload(served, ACME, "shared", "mlp").status_code == 201
    assert workers(served, GLOBEX, "shared").status_code == 404
    # only an admin marks an adapter public; its owner may not
    r = httpx.patch(f"{served.url}/v1/adapters/shared", json={"public": True}, headers=auth(ACME))
    assert r.status_code == 403
    r = httpx.patch(
        f"{served.url}/v1/adapters/shared?tenant=acme", json={"public": True}, headers=auth(ADMIN)
    )
    assert r.status_code == 200 and r.json()["public"] is True
    for key in (ACME, GLOBEX):
        r = workers(served, key, "shared")
        assert r.status_code == 200 and r.json()["result"]["response"] == want(served, "mlp")
    shown = httpx.get(f"{served.url}/v1/adapters/shared", headers=auth(GLOBEX))
    assert shown.status_code == 200 and shown.json()["owner"] == "acme"
    # globex may use it, not delete or unpublish it
    r = httpx.delete(f"{served.url}/v1/adapters/shared", headers=auth(GLOBEX))
    assert r.status_code == 403 and served.registry.exists("shared", "acme")
    r = httpx.patch(
        f"{served.url}/v1/adapters/shared", json={"public": False}, headers=auth(GLOBEX)
    )
    assert r.status_code == 403
    # the owner may delete it
    assert httpx.delete(f"{served.url}/v1/adapters/shared", headers=auth(ACME)).status_code == 200
    assert workers(served, GLOBEX, "shared").status_code == 404


def test_operator_preloads_cannot_be_squatted_or_deleted_by_a_tenant(served):
    # globex may own an "upper" of its own, which it then gets; acme still gets the operator's
    r = httpx.delete(f"{served.url}/v1/adapters/upper", headers=auth(GLOBEX))
    assert r.status_code == 403 and served.registry.exists("upper", OPERATOR)
    assert upload(served, GLOBEX, "upper", "rot13").status_code == 201
    assert workers(served, GLOBEX, "upper").json()["result"]["response"] == want(served, "rot13")
    assert workers(served, ACME, "upper").json()["result"]["response"] == want(served, "upper")
    assert httpx.delete(f"{served.url}/v1/adapters/upper", headers=auth(GLOBEX)).status_code == 200
    assert served.registry.exists("upper", OPERATOR)
    # an admin key changes another tenant's public adapter only by naming its owner
    r = httpx.delete(f"{served.url}/v1/adapters/upper", headers=auth(ADMIN))
    assert r.status_code == 400 and f"?tenant={OPERATOR}" in r.json()["error"]["message"]
    r = httpx.patch(f"{served.url}/v1/adapters/upper", json={"public": False}, headers=auth(ADMIN))
    assert r.status_code == 400 and served.registry.public_owner("upper") == OPERATOR
    # the admin may delete the operator's (and only then is it gone for everyone)
    r = httpx.delete(f"{served.url}/v1/adapters/upper?tenant={OPERATOR}", headers=auth(ADMIN))
    assert r.status_code == 200 and workers(served, ACME, "upper").status_code == 404


def test_admin_uploads_for_a_tenant(served):
    r = upload(served, ADMIN, "ops-made", "qk", tenant="globex")
    assert r.status_code == 201 and r.json()["owner"] == "globex"
    assert workers(served, GLOBEX, "ops-made").status_code == 200
    assert workers(served, ACME, "ops-made").status_code == 404
    r = upload(served, ACME, "sneaky", "qk", tenant="globex")
    assert r.status_code == 403 and not served.registry.exists("sneaky", "globex")


def test_errors_name_the_problem_as_json(served):
    r = httpx.patch(f"{served.url}/v1/adapters/support-bot", json={"public": "maybe"},
                    headers=auth(ADMIN))  # fmt: skip
    assert r.status_code == 400 and "public" in json.dumps(r.json())
