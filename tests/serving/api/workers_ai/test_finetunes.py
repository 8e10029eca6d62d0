"""Workers AI's finetunes and Cloudflare's account paths over HTTP: a finetune serves only
once both files are in and checked, a failed upload leaves it as it was, a key acts in its
own account only, and every answer, errors included, is in Cloudflare's envelope."""

import threading
import uuid

import httpx
import pytest

from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
ACCOUNT = "/client/v4/accounts/acme"  # wrangler's prefix, in ACME's account


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("finetunes")) as s:
        yield s


def call(served, method, path, key=ACME, **kw):
    return httpx.request(method, f"{served.url}{path}", headers={"Authorization": f"Bearer {key}"},
                         timeout=60, **kw)  # fmt: skip


def create(served, name, key=ACME, account=ACCOUNT, **fields):
    body = {"model": MODEL_ID, "name": name, **fields}
    return call(served, "POST", f"{account}/ai/finetunes", key, json=body)


def asset(served, finetune_id, file_name, data, key=ACME, account=ACCOUNT):
    return call(served, "POST", f"{account}/ai/finetunes/{finetune_id}/finetune-assets", key,
                data={"file_name": file_name}, files={"file": ("blob", data)})  # fmt: skip


def run(served, lora, account=ACCOUNT, key=ACME):
    body = {"prompt": "what is up", "max_tokens": 4, "temperature": 0, "lora": lora}
    return call(served, "POST", f"{account}/ai/run/{MODEL_ID}", key, json=body)


def files_of(served, source):
    adapter = served.world.adapters[served.world.versions[source]]
    return {CONFIG: adapter.config_bytes, WEIGHTS: adapter.weights_bytes}


def error_of(r) -> str:
    body = r.json()
    assert body["success"] is False and body["result"] is None and body["messages"] == []
    [error] = body["errors"]
    assert error["code"] == r.status_code
    return error["message"]


def listed(served, key=ACME, account=ACCOUNT):
    r = call(served, "GET", f"{account}/ai/finetunes", key)
    assert r.status_code == 200 and r.json()["success"] is True
    return {f["id"]: f for f in r.json()["result"]}


def test_a_finetune_serves_once_both_files_are_in_and_checked(served):
    r = create(served, "ft-rot13", description="rotates")
    assert r.status_code == 200, r.text
    made = r.json()["result"]
    assert (made["name"], made["model"], made["description"], made["ready"]) == (
        "ft-rot13", MODEL_ID, "rotates", False)  # fmt: skip
    files = files_of(served, "rot13")
    assert asset(served, made["id"], CONFIG, files[CONFIG]).status_code == 200
    r = run(served, made["id"])
    assert r.status_code == 404 and "not ready" in error_of(r)
    assert run(served, "ft-rot13").status_code == 404  # no adapter of that name yet
    before = listed(served)[made["id"]]
    # weights that are no safetensors: refused, naming why, and not kept
    r = asset(served, made["id"], WEIGHTS, b"\x00" * 64)
    assert r.status_code == 400 and "adapter_model.safetensors" in error_of(r)
    assert listed(served)[made["id"]] == before
    r = asset(served, made["id"], WEIGHTS, files[WEIGHTS])
    assert r.status_code == 200 and r.json()["result"]["ready"] is True
    want = run(served, "rot13").json()["result"]["response"]
    for lora in (made["id"], "ft-rot13", f"{MODEL_ID}:ft-rot13"):
        r = run(served, lora)
        assert r.status_code == 200 and r.json()["result"]["response"] == want
    # on every wing path, and in the version list of /v1/adapters
    r = call(served, "POST", f"/ai/run/{MODEL_ID}", json={"prompt": "what is up",
             "max_tokens": 4, "temperature": 0, "lora": made["id"]})  # fmt: skip
    assert r.json()["result"]["response"] == want
    assert call(served, "GET", "/v1/adapters/ft-rot13").json()["owner"] == "acme"
    # complete: its files cannot change
    r = asset(served, made["id"], CONFIG, files[CONFIG])
    assert r.status_code == 409 and "POST /v1/adapters" in error_of(r)


def test_a_bad_config_alone_is_refused_and_not_kept(served):
    made = create(served, "ft-badconfig").json()["result"]
    r = asset(served, made["id"], CONFIG, b'{"peft_type": "LORA", "r": -3}')
    assert r.status_code == 400 and error_of(r)
    files = files_of(served, "upper")
    assert asset(served, made["id"], WEIGHTS, files[WEIGHTS]).json()["result"]["ready"] is False
    assert asset(served, made["id"], CONFIG, files[CONFIG]).json()["result"]["ready"] is True


@pytest.mark.parametrize(
    ("file_name", "says"),
    [("adapter_model.bin", "pickle"), ("notes.txt", "not a finetune file")],
)
def test_other_files_are_refused_by_name(served, file_name, says):
    made = create(served, f"ft-file-{len(file_name)}").json()["result"]
    r = asset(served, made["id"], file_name, b"x")
    assert r.status_code == 400 and says in error_of(r)


def test_create_refusals_name_the_field(served):
    r = create(served, "ft-x", model="@cf/meta/llama-3-8b-instruct")
    assert r.status_code == 400 and "this server serves 'demo'" in error_of(r)
    r = create(served, "Not A Name")
    assert r.status_code == 400 and error_of(r).startswith("name")
    r = create(served, "ft-public", public=True)
    assert r.status_code == 403 and "admin" in error_of(r)
    r = create(served, "upper")  # an adapter acme already has
    assert r.status_code == 409 and "POST /v1/adapters" in error_of(r)
    r = create(served, "ft-x", colour="red")
    assert r.status_code == 400 and "colour" in error_of(r)


def test_creating_an_unfinished_name_again_replaces_it(served):
    first = create(served, "ft-again").json()["result"]
    asset(served, first["id"], CONFIG, files_of(served, "mlp")[CONFIG])
    second = create(served, "ft-again").json()["result"]
    assert second["id"] != first["id"]
    assert first["id"] not in listed(served) and second["id"] in listed(served)
    r = asset(served, first["id"], WEIGHTS, files_of(served, "mlp")[WEIGHTS])
    assert r.status_code == 404


def test_wranglers_create_without_a_content_type_is_json(served):
    body = b'{"model": "demo", "name": "ft-plain", "description": ""}'
    r = httpx.post(f"{served.url}{ACCOUNT}/ai/finetunes", content=body, timeout=30,
                   headers={"Authorization": f"Bearer {ACME}", "Content-Type": "text/plain"})  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_key_acts_in_its_own_account_only(served):
    made = create(served, "ft-private").json()["result"]
    for name, data in files_of(served, "upper").items():
        asset(served, made["id"], name, data)
    # another account's path, and an account that never existed, read the same
    theirs = call(served, "GET", "/client/v4/accounts/globex/ai/finetunes")
    nobody = call(served, "GET", "/client/v4/accounts/nobody/ai/finetunes")
    assert theirs.status_code == nobody.status_code == 404
    assert error_of(theirs) == error_of(nobody).replace("'nobody'", "'globex'")
    # acme's finetune id is nothing to globex: unknown as a lora, and as a finetune
    other = str(uuid.uuid4())
    r = run(served, made["id"], "/client/v4/accounts/globex", GLOBEX)
    unknown = run(served, other, "/client/v4/accounts/globex", GLOBEX)
    assert r.status_code == unknown.status_code == 404
    assert error_of(r) == error_of(unknown).replace(other, made["id"])
    r = asset(served, made["id"], CONFIG, b"{}", GLOBEX, "/client/v4/accounts/globex")
    stranger = asset(served, str(uuid.uuid4()), CONFIG, b"{}", GLOBEX, "/accounts/globex")
    assert r.status_code == stranger.status_code == 404
    assert made["id"] not in listed(served, GLOBEX, "/accounts/globex")
    # an admin's key is bound to its own account too
    assert call(served, "GET", f"{ACCOUNT}/ai/finetunes", ADMIN).status_code == 404


def test_public_finetunes_of_an_admin(served):
    made = create(served, "ft-shared", ADMIN, "/accounts/ops", public=True).json()["result"]
    assert made["public"] is True
    for name, data in files_of(served, "mlp").items():
        asset(served, made["id"], name, data, ADMIN, "/accounts/ops")
    r = call(served, "GET", "/accounts/globex/ai/finetunes/public", GLOBEX)
    assert [f["id"] for f in r.json()["result"] if f["name"] == "ft-shared"] == [made["id"]]
    r = run(served, made["id"], "/accounts/globex", GLOBEX)
    assert r.status_code == 200, r.text


def test_the_account_api_answers_from_our_keys(served):
    for root in ("", "/client/v4"):
        r = call(served, "GET", f"{root}/user/tokens/verify")
        assert r.json()["result"]["status"] == "active" and r.json()["success"] is True
        r = call(served, "GET", f"{root}/memberships", GLOBEX)
        assert [m["account"]["id"] for m in r.json()["result"]] == ["globex"]
        r = httpx.get(f"{served.url}{root}/user/tokens/verify", timeout=30)
        assert r.status_code == 401 and error_of(r)


def test_unknown_paths_and_limits_answer_in_the_envelope(served):
    r = call(served, "GET", f"{ACCOUNT}/ai/nothing-here")
    assert r.status_code == 404 and "no such route" in error_of(r)
    r = call(served, "GET", f"{ACCOUNT}/ai/models/schema", params={"model": "other"})
    assert r.status_code == 404 and error_of(r)
    r = call(served, "GET", f"{ACCOUNT}/ai/finetunes/public", params={"orderBy": "colour"})
    assert r.status_code == 400 and "orderBy" in error_of(r)


def test_both_files_at_once_publish_the_finetune(served):
    made = create(served, "ft-together").json()["result"]
    files = files_of(served, "qk")
    answers = {}
    threads = [
        threading.Thread(target=lambda n=n: answers.update({n: asset(served, made["id"], n,
                                                                       files[n])}))
        for n in files
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in answers.values()] == [200, 200]
    assert listed(served)[made["id"]]["ready"] is True
    assert run(served, made["id"]).status_code == 200


def test_another_tenants_private_finetune_id_is_unknown_to_an_admin_too(served):
    made = create(served, "ft-admin-probe").json()["result"]
    other = str(uuid.uuid4())
    # unfinished: its name is not told
    r = run(served, made["id"], "/accounts/ops", ADMIN)
    unknown = run(served, other, "/accounts/ops", ADMIN)
    assert r.status_code == unknown.status_code == 404
    assert error_of(r) == error_of(unknown).replace(other, made["id"])
    assert "ft-admin-probe" not in r.text
    for name, data in files_of(served, "upper").items():
        asset(served, made["id"], name, data)
    r = run(served, made["id"], "/accounts/ops", ADMIN)
    assert r.status_code == 404 and error_of(r) == error_of(unknown).replace(other, made["id"])


def test_junk_weights_are_refused_before_their_pair_arrives(served):
    made = create(served, "ft-junk").json()["result"]
    r = asset(served, made["id"], WEIGHTS, b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert r.status_code == 400 and "safetensors header" in error_of(r)
    files = files_of(served, "upper")
    assert asset(served, made["id"], CONFIG, files[CONFIG]).json()["result"]["ready"] is False


def test_a_name_taken_since_the_create_is_not_overwritten(served):
    made = create(served, "ft-late").json()["result"]
    upload = {k: (k, v) for k, v in files_of(served, "qk").items()}
    r = call(served, "POST", "/v1/adapters", data={"name": "ft-late"}, files=upload)
    assert r.status_code == 201, r.text
    digest = r.json()["digest"]
    files = files_of(served, "ov")
    asset(served, made["id"], CONFIG, files[CONFIG])
    r = asset(served, made["id"], WEIGHTS, files[WEIGHTS])
    assert r.status_code == 409 and "another name" in error_of(r)
    assert call(served, "GET", "/v1/adapters/ft-late").json()["digest"] == digest
    assert listed(served)[made["id"]]["ready"] is False


def test_public_listing_follows_the_registrys_flag(served):
    made = create(served, "ft-flag", ADMIN, "/accounts/ops", public=True).json()["result"]
    for name, data in files_of(served, "ov").items():
        asset(served, made["id"], name, data, ADMIN, "/accounts/ops")
    # globex owns a private adapter of the same name: the public finetune is listed still
    upload = {k: (k, v) for k, v in files_of(served, "qk").items()}
    call(served, "POST", "/v1/adapters", GLOBEX, data={"name": "ft-flag"}, files=upload)
    public = call(served, "GET", "/accounts/globex/ai/finetunes/public", GLOBEX).json()["result"]
    assert [f["id"] for f in public if f["name"] == "ft-flag"] == [made["id"]]
    assert all(f["name"] != "ft-rot13" for f in public)  # acme's private one
    r = call(served, "PATCH", "/v1/adapters/ft-flag", ADMIN, json={"public": False})
    assert r.status_code == 200, r.text
    assert listed(served, ADMIN, "/accounts/ops")[made["id"]]["public"] is False
    public = call(served, "GET", "/accounts/globex/ai/finetunes/public", GLOBEX).json()["result"]
    assert all(f["id"] != made["id"] for f in public)
