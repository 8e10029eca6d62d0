"""API keys: the file and environment formats, and 401/403 as JSON in each route's style."""

import asyncio

import httpx
import pytest

from serving.api import create_app
from serving.api.core.caller import OPEN, Principal
from serving.api.core.errors import ApiError
from serving.api.core.keys_file import load_keys
from serving.api.edge.keys import KeyRing
from serving.config import ConfigError
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve, stub_settings

K1, K2, K3 = "k-one-0123456789ab", "k-two-0123456789ab", "k-three-0123456789"


def test_key_file_and_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# key tenant scope\n\n{K1}  acme  user   # support team\n{K2} ops admin\n")
    keys = load_keys(path, env={"LORASERVE_API_KEYS": f"{K3}:globex:user, {K2}:ops:admin"})
    assert keys == {
        K1: Principal("acme", "user"),
        K2: Principal("ops", "admin"),
        K3: Principal("globex", "user"),
    }
    assert load_keys(None, env={}) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{K1} acme\n", "line 1: expected KEY TENANT SCOPE, got 2 field"),
        (f"# ok\n{K1} acme root\n", "line 2: scope must be user or admin, got 'root'"),
        (f"{K1} ac/me user\n", "line 1: invalid tenant 'ac/me'"),
        (f"{K1} acme user\n{K1} globex user\n", "line 2: this key is already given"),
        (f"{K1} acme user extra\n", "line 1: expected KEY TENANT SCOPE, got 4"),
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
        load_keys(None, env={"LORASERVE_API_KEYS": f"{K1}:b:user,{K2}:d:boss"})
    with pytest.raises(ConfigError, match="not found"):
        load_keys(tmp_path / "absent", env={})


def test_short_keys_are_refused_naming_the_tenant_not_the_key(tmp_path):
    short = "acme-key-123456"  # 15 characters
    path = tmp_path / "keys"
    path.write_text(f"{K1} ops admin\n{short} acme user\n")
    with pytest.raises(ConfigError) as info:
        load_keys(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}, line 2: the key of tenant 'acme' is shorter than 16")
    assert short not in message and "\n" not in message
    with pytest.raises(ConfigError, match="entry 2: the key of tenant 'globex' is shorter") as info:
        load_keys(None, env={"LORASERVE_API_KEYS": f"{K1}:acme:user,{short}:globex:user"})
    assert short not in str(info.value)
    assert set(load_keys(None, env={"LORASERVE_API_KEYS": f"{'k' * 16}:acme:user"})) == {"k" * 16}


def test_a_keys_file_others_may_read_is_warned_of_once(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text(f"{K1} acme user\n")
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="loraserve.api"):
        load_keys(path, env={})
    assert caplog.records == []
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="loraserve.api"):
        load_keys(path, env={})
        load_keys(path, env={})  # a start reads the file more than once
    (record,) = caplog.records
    assert record.getMessage() == (
        f"API keys file {path}: group or others may read or write it (mode 644): chmod 600 {path}"
    )


def test_key_ring_lookup():
    ring = KeyRing({"alpha-key": Principal("a", "user"), "beta-key": Principal("b", "admin")})
    assert ring.lookup("alpha-key") == Principal("a", "user")
    assert ring.lookup("beta-key").is_admin
    assert ring.lookup("alpha-ke") is None and ring.lookup("") is None
    assert not ring.open and KeyRing({}).open


def test_scopes_and_the_open_caller():
    # Who may manage which adapter is adapters.registry.visibility's (tests/adapters/registry).
    assert Principal("x", "admin").is_admin and not Principal("a", "user").is_admin
    assert OPEN.is_admin


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


def test_a_client_sending_wrong_keys_is_throttled_before_its_keys_are_compared():
    ring = KeyRing({K1: Principal("acme", "user")})
    for _ in range(20):
        with pytest.raises(ApiError) as info:
            ring.identify("Bearer not-a-key-0123456789", "10.0.0.1")
        assert info.value.status == 401
    with pytest.raises(ApiError) as info:
        ring.identify(f"Bearer {K1}", "10.0.0.1")  # even the right key: it is not compared
    assert info.value.status == 429 and info.value.code == "too_many_invalid_keys"
    assert 1 <= int(info.value.headers["Retry-After"]) <= 60
    assert ring.identify(f"Bearer {K1}", "10.0.0.2") == Principal("acme", "user")
    with pytest.raises(ApiError) as info:  # another client's success reset nothing
        ring.identify(f"Bearer {K1}", "10.0.0.1")
    assert info.value.status == 429
    with pytest.raises(ApiError) as info:  # no key at all is no guess: still 401
        ring.identify(None, "10.0.0.1")
    assert info.value.status == 401


def test_wrong_keys_over_http_get_429_with_retry_after_at_the_gate_and_the_routes(world, tmp_path):
    app = create_app(None, stub_settings(world, tmp_path))

    async def calls():
        guesser = httpx.ASGITransport(app, client=("203.0.113.7", 4000))
        other = httpx.ASGITransport(app, client=("198.51.100.2", 4000))
        async with httpx.AsyncClient(transport=guesser, base_url="http://test") as a, \
                httpx.AsyncClient(transport=other, base_url="http://test") as b:  # fmt: skip
            wrong = {"Authorization": f"Bearer {ACME}x"}
            right = {"Authorization": f"Bearer {ACME}"}
            for n in range(20):  # half to the gate (a body), half to a route's dependency
                r = await (a.post("/v1/chat/completions", json={}, headers=wrong) if n % 2
                           else a.get("/v1/adapters", headers=wrong))  # fmt: skip
                assert r.status_code == 401
            for r in (await a.post("/v1/chat/completions", json={}, headers=right),
                      await a.get("/v1/adapters", headers=right),
                      await a.post(f"/ai/run/{MODEL_ID}", json={}, headers=right)):  # fmt: skip
                assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
                assert "too many invalid API keys" in r.text
            assert (await b.get("/v1/adapters", headers=right)).status_code == 200
            assert (await a.get("/v1/adapters", headers=right)).status_code == 429

    asyncio.run(calls())
