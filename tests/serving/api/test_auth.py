"""API keys: the file and environment formats, and 401/403 as JSON in each route's style."""

import httpx
import pytest

from serving.api.auth import OPEN, KeyRing, Principal, load_keys
from serving.config import ConfigError
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve


def test_key_file_and_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# key tenant scope\n\nk-one  acme  user   # support team\nk-two ops admin\n")
    keys = load_keys(path, env={"LORASERVE_API_KEYS": "k-three:globex:user, k-two:ops:admin"})
    assert keys == {
        "k-one": Principal("acme", "user"),
        "k-two": Principal("ops", "admin"),
        "k-three": Principal("globex", "user"),
    }
    assert load_keys(None, env={}) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1 acme\n", "line 1: expected KEY TENANT SCOPE, got 2 field"),
        ("# ok\nk1 acme root\n", "line 2: scope must be user or admin, got 'root'"),
        ("k1 ac/me user\n", "line 1: invalid tenant 'ac/me'"),
        ("k1 acme user\nk1 globex user\n", "line 2: this key is already given"),
        ("k1 acme user extra\n", "line 1: expected KEY TENANT SCOPE, got 4"),
    ],
)
def test_bad_key_files_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_keys(path, env={})
    assert str(info.value).startswith(f"{path}, ") and message in str(info.value)


def test_bad_environment_entries_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="LORASERVE_API_KEYS, entry 2: scope"):
        load_keys(None, env={"LORASERVE_API_KEYS": "a:b:user,c:d:boss"})
    with pytest.raises(ConfigError, match="not found"):
        load_keys(tmp_path / "absent", env={})


def test_key_ring_lookup():
    ring = KeyRing({"alpha-key": Principal("a", "user"), "beta-key": Principal("b", "admin")})
    assert ring.lookup("alpha-key") == Principal("a", "user")
    assert ring.lookup("beta-key").is_admin
    assert ring.lookup("alpha-ke") is None and ring.lookup("") is None
    assert not ring.open and KeyRing({}).open


def test_may_manage():
    assert Principal("a", "user").may_manage("a") and not Principal("a", "user").may_manage("b")
    assert Principal("x", "admin").may_manage("b") and OPEN.is_admin


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("auth")) as s:
        yield s


CASES = [  # method, path, body
    ("POST", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    ("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "x", "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/adapters", None),
    ("DELETE", "/v1/adapters/upper", None),
    ("POST", f"/ai/run/{MODEL_ID}", {"prompt": "x", "max_tokens": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body"), CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("key", [None, "not-a-key", f"{ACME}x"], ids=["none", "wrong", "longer"])
def test_missing_or_unknown_keys_are_401(served, method, path, body, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.request(method, served.url + path, json=body, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    if path.startswith("/ai/"):
        assert r.json()["success"] is False and r.json()["errors"][0]["code"] == 401
    else:
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert served.registry.exists("upper", "acme")


def test_a_basic_scheme_is_401(served):
    r = httpx.get(served.url + "/v1/models", headers={"Authorization": f"Basic {ACME}"})
    assert r.status_code == 401


def test_another_tenants_adapter_is_missing_and_the_admin_may_delete_it(served):
    def delete(key, query=""):
        auth = {"Authorization": f"Bearer {key}"}
        return httpx.delete(served.url + "/v1/adapters/mlp" + query, headers=auth)

    r = delete(GLOBEX)
    assert r.status_code == 404 and r.json()["error"]["message"] == "unknown adapter 'mlp'"
    assert served.registry.exists("mlp", "acme")
    assert delete(ADMIN).status_code == 404  # the admin's own tenant has no "mlp"
    assert delete(ADMIN, "?tenant=acme").status_code == 200
    assert not served.registry.exists("mlp", "acme")


def test_probes_need_no_key(served):
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert httpx.get(served.url + path).status_code == 200, path


def test_no_keys_means_open_as_the_default_admin(world, tmp_path):
    with serve(world, tmp_path, keys={}, owner="default") as open_server:
        r = httpx.get(open_server.url + "/v1/adapters")
        assert r.status_code == 200 and {a["owner"] for a in r.json()["data"]} == {"default"}
        assert httpx.delete(open_server.url + "/v1/adapters/rot13").status_code == 200
