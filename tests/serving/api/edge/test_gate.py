"""The gate: keys before bodies, and a keyless server's Host and Origin checks against browsers
(DNS rebinding, cross-site forms and uploads), each answered as JSON in its route's style."""

import asyncio

import httpx
import pytest

from serving.api import create_app
from serving.api.edge.gate import loopback_authority
from tests.adapters.factory import peft_adapter_files
from tests.serving.api.served import ACME, MODEL_ID, serve, stub_settings

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
EVIL = "https://evil.example"


@pytest.mark.parametrize(
    ("authority", "loopback"),
    [
        ("localhost", True), ("LOCALHOST:8000", True), ("127.0.0.1", True),
        ("127.0.0.1:8000", True), ("127.8.9.10:1", True), ("[::1]", True), ("[::1]:8000", True),
        ("evil.example", False), ("evil.example:8000", False), ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False), ("10.0.0.1:8000", False), ("[::2]:80", False),
        ("evil.example@127.0.0.1", False), ("127.0.0.1:8000/x", False), ("::1", False),
        ("127.0.0.1:", False), ("", False), ("localhost\n", False),
    ],
)  # fmt: skip
def test_loopback_authorities(authority, loopback):
    assert loopback_authority(authority) is loopback


@pytest.fixture(scope="module")
def keyless(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("keyless"), keys={}, owner="default") as s:
        yield s


def upload_form(name):
    files = {k: (k, v) for k, v in peft_adapter_files().items()}
    return {"data": {"name": name}, "files": files}


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "192.168.1.20:8000"])
def test_a_keyless_server_refuses_other_host_names(keyless, host):
    # A rebound name reaches 127.0.0.1 with the attacker's name in Host.
    for method, path, body in [
        ("GET", "/v1/adapters", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/chat/completions", CHAT),
    ]:
        r = httpx.request(method, keyless.url + path, json=body, headers={"Host": host})
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["type"] == "permission_error"
        assert "loopback names only" in r.json()["error"]["message"]
    r = httpx.post(
        keyless.url + f"/ai/run/{MODEL_ID}", json={"prompt": "x"}, headers={"Host": host}
    )
    assert r.status_code == 403 and r.json()["success"] is False
    assert r.json()["errors"][0]["code"] == 403


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1:80", "[::1]:8000"])
def test_a_keyless_server_answers_loopback_names(keyless, host):
    assert httpx.get(keyless.url + "/v1/adapters", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("origin", [EVIL, "null", "http://localhost.evil.example", "file://"])
def test_cross_origin_changes_are_refused(keyless, world, origin):
    headers = {"Origin": origin}
    r = httpx.post(keyless.url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 403 and "cross-origin" in r.json()["error"]["message"]
    # A multipart upload needs no preflight: the gate is all that stops a page's form.
    r = httpx.post(keyless.url + "/v1/adapters", headers=headers, **upload_form("forged"))
    assert r.status_code == 403 and not keyless.registry.exists("forged")
    r = httpx.delete(keyless.url + "/v1/adapters/rot13", headers=headers)
    assert r.status_code == 403 and keyless.registry.exists("rot13")
    # Reading is not a change, and a cross-origin page cannot read the answer (no CORS).
    assert httpx.get(keyless.url + "/v1/adapters", headers=headers).status_code == 200


def test_another_local_apps_page_may_not_change_state(keyless):
    # Another loopback origin is another app's page (a dev server on :3000, say): no more
    # to be trusted than any site's. Only scheme, host and port all equal are this server.
    port = keyless.url.rsplit(":", 1)[1]
    for origin in (
        "http://localhost:3000",
        f"http://localhost:{port}",
        "http://127.0.0.1",
        f"https://127.0.0.1:{port}",
        f"http://127.0.0.2:{port}",
        f"http://[::1]:{port}",
    ):
        headers = {"Origin": origin}
        r = httpx.post(keyless.url + "/v1/adapters", headers=headers, **upload_form("foreign"))
        assert r.status_code == 403 and "cross-origin" in r.json()["error"]["message"], origin
        assert not keyless.registry.exists("foreign")
        r = httpx.delete(keyless.url + "/v1/adapters/rot13", headers=headers)
        assert r.status_code == 403 and keyless.registry.exists("rot13"), origin


@pytest.mark.parametrize(
    ("host", "origin"),
    [("127.0.0.1:{port}", "http://127.0.0.1:{port}"), ("LOCALHOST:{port}", "http://localhost:{port}"),
     ("[::1]:{port}", "http://[::1]:{port}"), ("localhost", "http://localhost:80"),
     ("localhost:80", "http://localhost")],
)  # fmt: skip
def test_its_own_origin_may_change_state(keyless, host, origin):
    # the dashboard's page, served by this server: its scheme and Host, default port or not
    port = keyless.url.rsplit(":", 1)[1]
    headers = {"Host": host.format(port=port), "Origin": origin.format(port=port)}
    r = httpx.delete(keyless.url + "/v1/adapters/no-such-adapter", headers=headers)
    assert r.status_code == 404, r.text  # past the gate, to the route


def test_its_own_page_uploads_and_deletes(keyless):
    same = {"Origin": keyless.url}  # as the dashboard sends them: multipart, then DELETE
    r = httpx.post(keyless.url + "/v1/adapters", headers=same, **upload_form("local"))
    assert r.status_code == 201 and keyless.registry.exists("local")
    r = httpx.delete(keyless.url + "/v1/adapters/local", headers=same)
    assert r.status_code == 200 and not keyless.registry.exists("local")


def test_insecure_serves_other_names_but_still_refuses_other_origins(world, tmp_path):
    with serve(world, tmp_path, keys={}, insecure=True) as s:
        host = "lab-box.internal:8000"
        assert httpx.get(s.url + "/v1/adapters", headers={"Host": host}).status_code == 200
        same = {"Host": host, "Origin": f"http://{host}"}
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers=same, timeout=30)
        assert r.status_code == 200
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Origin": EVIL})
        assert r.status_code == 403


def test_with_keys_any_host_and_origin_may_call(world, tmp_path):
    # The key is the protection: a browser cannot send Authorization cross-site unasked.
    with serve(world, tmp_path) as s:
        headers = {"Host": "api.example.com", "Origin": EVIL, "Authorization": f"Bearer {ACME}"}
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=30)
        assert r.status_code == 200


class Client:
    """An ASGI client whose body arrives in chunks, counting the bytes the app took."""

    def __init__(self, num_chunks: int, chunk: bytes = b" " * 65536):
        self.num_chunks, self.chunk, self.received = num_chunks, chunk, 0
        self.messages: list[dict] = []

    async def receive(self) -> dict:
        self.received += len(self.chunk)
        self.num_chunks -= 1
        return {"type": "http.request", "body": self.chunk, "more_body": self.num_chunks > 0}

    async def send(self, message: dict) -> None:
        self.messages.append(message)

    def call(self, app, path: str, headers: list[tuple[bytes, bytes]]) -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"host", b"127.0.0.1"), *headers],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
        }  # fmt: skip
        asyncio.run(app(scope, self.receive, self.send))
        return self.messages[0]["status"]


@pytest.mark.parametrize(
    "auth", [[], [(b"authorization", b"Bearer wrong-key")], [(b"authorization", b"Basic x")]]
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/adapters", f"/ai/run/{MODEL_ID}"])
def test_a_bad_key_is_refused_before_the_body_is_read(world, tmp_path, auth, path):
    app = create_app(None, stub_settings(world, tmp_path, max_body_bytes=32 << 20))
    client = Client(num_chunks=512)  # 32 MiB, streamed
    chunked = [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")]
    assert client.call(app, path, [*auth, *chunked]) == 401
    assert client.received == 0
    headers = dict(client.messages[0]["headers"])
    assert headers[b"www-authenticate"] == b"Bearer" and headers[b"connection"] == b"close"
    body = client.messages[1]["body"]
    assert b"API key" in body and (b'"success": false' in body) == path.startswith("/ai/")


def test_a_valid_key_gets_its_body_read(world, tmp_path):
    app = create_app(None, stub_settings(world, tmp_path))
    client = Client(num_chunks=2, chunk=b"[1, 2]")
    auth = [(b"authorization", f"Bearer {ACME}".encode()), (b"content-type", b"application/json")]
    assert client.call(app, "/v1/chat/completions", auth) == 400  # read, and not an object
    assert client.received == 12
