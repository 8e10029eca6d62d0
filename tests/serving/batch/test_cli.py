"""`loraserve batch` without a model: a file is checked line by line before anything is sent,
and the server's answers (scripted here) become one summary line or one `error:` line."""

import json
import socket

import httpx
import pytest
from typer.testing import CliRunner

from serving.batch import cli
from serving.cli import app

runner = CliRunner()
BATCH_ID = "batch_" + "ab" * 12


class Scripted:
    """A scripted server: records each request, answers from `answers[(method, path)]`, a
    list whose last entry repeats once the others are used up."""

    def __init__(self, answers):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        queue = self.answers.get((request.method, request.url.path))
        if not queue:
            return httpx.Response(404, json={"detail": "Not Found"})
        status, body = queue.pop(0) if len(queue) > 1 else queue[0]
        return httpx.Response(status, json=body)


@pytest.fixture
def scripted(monkeypatch):
    """Install a Scripted server as every command's transport; returns a setter."""

    def install(answers):
        server = Scripted(answers)

        def client(url, headers):
            transport = httpx.MockTransport(server)
            return httpx.Client(base_url=url, headers=headers, transport=transport)

        monkeypatch.setattr(cli, "_client", client)
        monkeypatch.setattr(cli, "POLL_S", 0.0)
        return server

    return install


def batch(*args, key="k-123"):
    env = {"LORASERVE_API_KEY": key} if key else {}
    return runner.invoke(app, ["batch", *args], env=env, catch_exceptions=False)


def error_lines(done) -> list[str]:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.exit_code == 1 and lines, done.output
    assert all(line.startswith("error: ") for line in lines) and "Traceback" not in done.output
    return lines


def openai_batch(status, total, completed, failed, endpoint="/ai/run"):
    counts = {"total": total, "completed": completed, "failed": failed}
    return {"id": BATCH_ID, "object": "batch", "endpoint": endpoint, "model": "demo",
            "status": status, "request_counts": counts, "errors": None,
            "output_file_id": None, "error_file_id": None}  # fmt: skip


def write_jsonl(tmp_path, *lines: str):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_every_malformed_line_is_named_and_nothing_is_sent(tmp_path, scripted):
    server = scripted({})
    path = write_jsonl(
        tmp_path,
        '{"prompt": "ok"}',
        "",
        "[1, 2]",
        '{"prompt": ',
        '{"prompt": "x", "stream": true}',
        '{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}',
    )
    lines = error_lines(batch("submit", str(path), "--model", "demo"))
    assert lines[0].startswith("error: line 3: not a JSON object")
    assert lines[1].startswith("error: line 4: not valid JSON")
    assert lines[2] == "error: line 5: stream must be absent or false in a batch"
    assert lines[3].startswith("error: line 6: an OpenAI batch line")
    assert "4 malformed line(s)" in lines[4] and "nothing was sent" in lines[4]
    assert server.seen == []


def test_an_empty_or_missing_file_is_refused(tmp_path, scripted):
    server = scripted({})
    empty = write_jsonl(tmp_path, "", "   ")
    assert "has no requests" in error_lines(batch("submit", str(empty), "--model", "demo"))[0]
    missing = str(tmp_path / "nope.jsonl")
    assert "cannot read" in error_lines(batch("submit", missing, "--model", "demo"))[0]
    assert server.seen == []


def test_an_unreachable_server_is_one_line(tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    path = write_jsonl(tmp_path, '{"prompt": "hi"}')
    for args in (["submit", str(path), "--model", "demo"], ["status", BATCH_ID], ["results", "x"]):
        [line] = error_lines(batch(*args, "--server", url))
        assert line.startswith(f"error: cannot reach the server at {url}")


@pytest.mark.parametrize(
    ("server", "key", "want"),
    [
        ("127.0.0.1:8000", "k-1", "error: invalid server URL '127.0.0.1:8000': expected http://HOST:PORT"),
        ("http://[::1", "k-1", "error: invalid server URL 'http://[::1' (Invalid port: ':1'): expected"),
        ("http://127.0.0.1:8000", "kä", "error: LORASERVE_API_KEY holds characters a key cannot have"),
    ],
)  # fmt: skip
def test_a_malformed_server_url_or_key_is_one_line_and_nothing_is_sent(scripted, server, key, want):
    sent = scripted({})
    for args in (["status", BATCH_ID], ["results", BATCH_ID]):
        done = batch(*args, "--server", server, key=key)
        [line] = error_lines(done)
        assert line.startswith(want) and "Traceback" not in done.output
    assert not sent.seen


def test_submit_sends_every_body_with_the_key_and_prints_only_the_id(tmp_path, scripted):
    queued = {"status": "queued", "request_id": BATCH_ID, "model": "@cf/x/y"}
    server = scripted({("POST", "/ai/run/@cf/x/y"): [(200, {"result": queued, "success": True})]})
    path = write_jsonl(tmp_path, '{"prompt": "a", "lora": "upper"}', "", '{"prompt": "b"}')
    done = batch("submit", str(path), "--model", "@cf/x/y")
    assert done.exit_code == 0 and done.stdout == f"{BATCH_ID}\n", done.output
    [sent] = server.seen
    assert sent.url.params["queueRequest"] == "true"
    assert sent.headers["authorization"] == "Bearer k-123"
    assert json.loads(sent.content) == {"requests": [{"prompt": "a", "lora": "upper"},
                                                     {"prompt": "b"}]}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "key", "want"),
    [
        (400, {"success": False, "result": None,
               "errors": [{"code": 400, "message": "requests[1].max_tokens: must be >= 1"}]},
         "k", "error: line 3, max_tokens: must be >= 1"),
        (400, {"success": False, "errors": [{"message": "requests.0: bad; requests.9: bad"}]},
         "k", "error: line 1: bad; requests.9: bad"),
        (413, {"error": {"message": "the body exceeds the limit of 10 MiB", "type": "x"}},
         "k", "error: the body exceeds the limit of 10 MiB"),
        (401, {"error": {"message": "missing API key"}}, None,
         "error: missing API key (set LORASERVE_API_KEY)"),
        (502, None, "k", "error: the server answered HTTP 502"),
    ],
)  # fmt: skip
def test_submit_shows_the_servers_refusal_in_one_line(tmp_path, scripted, status, body, key, want):
    scripted({("POST", "/ai/run/demo"): [(status, body)]})
    path = write_jsonl(tmp_path, '{"prompt": "a"}', "", '{"prompt": "b", "max_tokens": 0}')
    assert error_lines(batch("submit", str(path), "--model", "demo", key=key)) == [want]


def test_status_follows_the_batch_until_it_finishes(scripted):
    path = ("GET", f"/v1/batches/{BATCH_ID}")
    server = scripted({path: [(200, openai_batch("in_progress", 3, 0, 0)),
                              (200, openai_batch("in_progress", 3, 1, 1)),
                              (200, openai_batch("completed", 3, 2, 1))]})  # fmt: skip
    done = batch("status", BATCH_ID)
    assert done.exit_code == 0 and done.stdout == "done: 2 succeeded, 1 failed\n", done.output
    assert len(server.seen) == 3

    server = scripted({path: [(200, openai_batch("in_progress", 3, 1, 0))]})
    done = batch("status", BATCH_ID, "--no-wait")
    assert done.stdout == "in_progress: 1 of 3 finished (1 succeeded, 0 failed)\n"
    assert len(server.seen) == 1


def test_status_summarises_a_cancelled_batch(scripted):
    scripted({("GET", f"/v1/batches/{BATCH_ID}"): [(200, openai_batch("cancelled", 5, 1, 1))]})
    assert batch("status", BATCH_ID).stdout == "cancelled: 1 succeeded, 1 failed, 3 cancelled\n"


def test_results_of_an_unfinished_batch_say_where_it_stands(scripted, tmp_path):
    running = {"status": "running", "request_id": BATCH_ID, "model": "demo", "total": 4,
               "completed": 1, "failed": 1}  # fmt: skip
    scripted({("GET", f"/v1/batches/{BATCH_ID}"): [(200, openai_batch("in_progress", 4, 1, 1))],
              ("POST", "/ai/run/demo"): [(200, {"result": running, "success": True})]})  # fmt: skip
    out = tmp_path / "out.jsonl"
    [line] = error_lines(batch("results", BATCH_ID, "-o", str(out)))
    assert f"batch {BATCH_ID} is still running: 2 of 4 finished" in line
    assert not out.exists()


def test_results_of_an_openai_batch_point_at_its_files(scripted):
    scripted({("GET", f"/v1/batches/{BATCH_ID}"): [
        (200, {**openai_batch("completed", 1, 1, 0, "/v1/chat/completions"),
               "output_file_id": "file-1"})]})  # fmt: skip
    [line] = error_lines(batch("results", BATCH_ID))
    assert "OpenAI Batch API" in line and "file-1" in line


def test_results_write_jsonl_in_order(scripted, tmp_path):
    responses = [{"id": 0, "success": True, "result": {"response": "é"}},
                 {"id": 1, "success": False, "result": None,
                  "errors": [{"code": 404, "message": "unknown adapter 'x'"}]}]  # fmt: skip
    done_ = {"status": "done", "request_id": BATCH_ID, "model": "demo", "total": 2,
             "completed": 1, "failed": 1, "responses": responses}  # fmt: skip
    scripted({("GET", f"/v1/batches/{BATCH_ID}"): [(200, openai_batch("completed", 2, 1, 1))],
              ("POST", "/ai/run/demo"): [(200, {"result": done_, "success": True})]})  # fmt: skip
    done = batch("results", BATCH_ID)
    assert [json.loads(line) for line in done.stdout.splitlines()] == responses
    out = tmp_path / "out.jsonl"
    done = batch("results", BATCH_ID, "-o", str(out))
    assert done.exit_code == 0 and done.stdout == ""
    assert [json.loads(line) for line in out.read_text().splitlines()] == responses
    assert f"wrote 2 result(s) to {out}: 1 succeeded, 1 failed" in " ".join(done.stderr.split())
