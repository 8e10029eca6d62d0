"""`loraserve batch` against a served model: a submitted file's greedy results match the same
bodies run one by one, and an item with an unknown adapter fails alone."""

import json
import re

import httpx
import pytest
from typer.testing import CliRunner

from serving.cli import app
from tests.serving.api.served import ACME, GLOBEX, MODEL_ID, serve

runner = CliRunner()
GREEDY = {"max_tokens": 5, "temperature": 0}
BODIES = [
    {"prompt": "what is up", "lora": "upper", **GREEDY, "external_reference": "r0"},
    {"prompt": "what is up", "lora": "nope", **GREEDY},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}], "lora": "rot13", **GREEDY},
    {"prompt": "plain text", "raw": True, **GREEDY, "max_tokens": 3},
]  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("batch-cli")) as s:  # upper, rot13, mlp: acme's
        yield s


def batch(served, *args, key=ACME):
    env = {"LORASERVE_API_KEY": key}
    argv = ["batch", *args, "--server", served.url]
    return runner.invoke(app, argv, env=env, catch_exceptions=False)


def one_line_error(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.exit_code == 1 and len(lines) == 1, done.output
    assert lines[0].startswith("error: ") and "Traceback" not in done.output
    return lines[0]


def direct(served, body):
    """The answer to body sent on its own, not in a batch."""
    body = {k: v for k, v in body.items() if k != "external_reference"}
    auth = {"Authorization": f"Bearer {ACME}"}
    return httpx.post(f"{served.url}/ai/run/{MODEL_ID}", json=body, headers=auth, timeout=60)


def submitted(served, tmp_path) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("\n\n".join(json.dumps(b) for b in BODIES) + "\n")  # blank lines between
    done = batch(served, "submit", str(path), "--model", MODEL_ID)
    assert done.exit_code == 0, done.output
    assert re.fullmatch(r"batch_[0-9a-f]{24}\n", done.stdout), done.stdout
    return done.stdout.strip()


def test_a_batch_gives_what_each_request_gives_alone(served, tmp_path):
    batch_id = submitted(served, tmp_path)
    done = batch(served, "status", batch_id)
    assert done.exit_code == 0 and done.stdout == "done: 3 succeeded, 1 failed\n", done.output
    assert batch(served, "status", batch_id, "--no-wait").stdout == done.stdout

    out = tmp_path / "out.jsonl"
    done = batch(served, "results", batch_id, "-o", str(out))
    assert done.exit_code == 0 and done.stdout == "", done.output
    assert "4 result(s)" in done.stderr and "3 succeeded, 1 failed" in done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in results] == [0, 1, 2, 3]
    assert [r.get("external_reference") for r in results] == ["r0", None, None, None]

    for body, got in zip(BODIES, results):
        alone = direct(served, body)
        if body.get("lora") == "nope":  # the one bad item fails with the error it gets alone
            assert alone.status_code == 404 and got["success"] is False and got["result"] is None
            message = alone.json()["errors"][0]["message"]
            assert "unknown adapter 'nope'" in message
            assert [e["message"] for e in got["errors"]] == [message]
            continue
        assert alone.status_code == 200 and got["success"] is True, got
        want = alone.json()["result"]
        assert got["result"]["response"] == want["response"]
        for count in ("prompt_tokens", "completion_tokens"):
            assert got["result"]["usage"][count] == want["usage"][count]

    on_stdout = batch(served, "results", batch_id)
    assert [json.loads(line) for line in on_stdout.stdout.splitlines()] == results


def test_another_tenants_batch_is_unknown(served, tmp_path):
    batch_id = submitted(served, tmp_path)
    for args in (["status", batch_id], ["status", batch_id, "--no-wait"], ["results", batch_id]):
        line = one_line_error(batch(served, *args, key=GLOBEX))
        assert "unknown batch" in line and batch_id in line, line
    missing = "batch_" + "0" * 24
    line = one_line_error(batch(served, "results", missing))
    assert "unknown batch" in line and missing in line


def test_the_servers_refusal_names_the_line(served, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"max_tokens": 3}\n')  # no prompt nor messages
    line = one_line_error(batch(served, "submit", str(path), "--model", MODEL_ID))
    assert line == "error: line 3: give exactly one of prompt and messages", line
