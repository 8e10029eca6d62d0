"""`loraserve adapters ...` given a malformed key, server URL, name or registry: one
`error:` line and status 1, before anything is sent, opened or created."""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from adapters.cli.http_json import RemoteError, api_key
from adapters.errors import AdapterError
from adapters.registry.names import validate_name
from serving.cli import app
from tests.adapters.factory import peft_adapter_files

runner = CliRunner()
KEY_ERROR = (
    "error: LORASERVE_API_KEY holds characters a key cannot have "
    "(keys are printable ASCII without spaces)"
)


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request with an empty adapter list and records what it was sent."""

    def _answer(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = json.dumps({"data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_DELETE = do_PATCH = do_POST = _answer

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def server():
    """A local HTTP server; `.url` to call it, `.seen` the requests it received."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    httpd.seen = []
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def cli(*args, key=None):
    env = {"LORASERVE_API_KEY": key}  # None unsets it, whatever the environment holds
    return runner.invoke(app, ["adapters", *args], env=env, catch_exceptions=False)


def error_line(done) -> str:
    """The one line a failed command printed; asserts it failed with exactly one line."""
    assert done.exit_code == 1, done.output
    assert "Traceback" not in done.output
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("key", ["kä", "k\x01y", "k 1", "k1\nk2", "ключ"])
def test_a_key_no_header_can_carry_is_named_before_any_request(server, key):
    done = cli("list", "--server", server.url, key=key)
    assert error_line(done) == KEY_ERROR
    assert server.seen == []


@pytest.mark.parametrize("key", ["k1\n", " k1", "\tk1\r\n"])
def test_whitespace_around_a_key_is_dropped(server, key):
    done = cli("list", "--server", server.url, key=key)
    assert done.exit_code == 0, done.output
    assert server.seen == [("GET", "/v1/adapters", "Bearer k1")]


def test_api_key():
    assert api_key("  k-1_x.Y~ \n") == "k-1_x.Y~"
    assert api_key(" \n") is None and api_key("") is None
    with pytest.raises(RemoteError, match="LORASERVE_API_KEY holds characters"):
        api_key("k\u00e4")


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8101", "localhost:8101", "ftp://127.0.0.1:8101", "http://", "http://:80"]
)
def test_a_server_url_without_http_is_named(url):
    done = cli("list", "--server", url)
    assert error_line(done) == f"error: invalid server URL {url!r}: expected http://HOST:PORT"


def test_an_unparseable_server_url_is_one_line():
    line = error_line(cli("list", "--server", "http://[::1"))
    assert line.startswith("error: invalid server URL 'http://[::1'")
    assert line.endswith("expected http://HOST:PORT")
    port = error_line(cli("show", "x", "--server", "http://127.0.0.1:99999"))
    assert port == "error: invalid server URL 'http://127.0.0.1:99999': port 99999 is out of range"


def _name_error(name: str) -> str:
    with pytest.raises(AdapterError) as caught:
        validate_name(name)
    return f"error: {caught.value}"


@pytest.mark.parametrize("command", [["show"], ["delete"], ["public"], ["public", "--off"]])
@pytest.mark.parametrize("name", ["..", "", "a/b", "a?b", "Bad", "base"])
def test_names_are_checked_before_choosing_the_catalogue(tmp_path, server, command, name):
    reg = tmp_path / "reg"
    reg.mkdir()
    expected = _name_error(name)
    remote = cli(command[0], name, *command[1:], "--server", server.url)
    assert error_line(remote) == expected
    assert server.seen == []
    local = cli(command[0], name, *command[1:], "--registry", str(reg))
    assert error_line(local) == expected
    assert list(reg.iterdir()) == []


def test_a_bad_name_or_tenant_sends_nothing_to_the_server(tmp_path, server):
    folder = tmp_path / "a"
    folder.mkdir()
    for file, data in peft_adapter_files().items():
        (folder / file).write_bytes(data)
    upload = cli("upload", str(folder), "--name", "../x", "--server", server.url)
    assert error_line(upload) == _name_error("../x")
    tenant = cli("show", "bot", "--tenant", "a b", "--server", server.url)
    assert error_line(tenant).startswith("error: invalid tenant 'a b': ")
    listed = cli("list", "--tenant", "a/b", "--server", server.url)
    assert error_line(listed).startswith("error: invalid tenant 'a/b': ")
    assert server.seen == []


READ_ONLY = [["list"], ["show", "bot"], ["delete", "bot"], ["public", "bot"], ["gc"]]


@pytest.mark.parametrize("command", READ_ONLY)
@pytest.mark.parametrize("scheme", ["", "file://"])
def test_reading_a_missing_registry_creates_nothing(tmp_path, command, scheme):
    uri = f"{scheme}{tmp_path / 'missing' / 'dir'}"
    done = cli(*command, "--registry", uri)
    assert error_line(done) == f"error: no registry at {uri}"
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", READ_ONLY)
def test_reading_a_missing_memory_registry_creates_nothing(command):
    from fsspec.core import url_to_fs

    uri = f"memory://absent-{uuid.uuid4().hex}"
    done = cli(*command, "--registry", uri)
    assert error_line(done) == f"error: no registry at {uri}"
    fs, root = url_to_fs(uri)
    assert not fs.exists(root)


def test_a_file_is_no_registry(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    assert error_line(cli("list", "--registry", str(path))) == f"error: no registry at {path}"


def test_upload_still_starts_a_registry_and_the_rest_then_read_it(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    for file, data in peft_adapter_files().items():
        (folder / file).write_bytes(data)
    reg = tmp_path / "new" / "reg"
    done = cli("upload", str(folder), "--name", "bot", "--registry", f"file://{reg}")
    assert done.exit_code == 0, done.output
    assert reg.is_dir()
    listed = cli("list", "--registry", str(reg))
    assert listed.exit_code == 0 and "bot" in listed.stdout
    empty = tmp_path / "empty"
    empty.mkdir()  # an existing folder is an empty registry, not a missing one
    assert cli("list", "--registry", str(empty)).exit_code == 0
