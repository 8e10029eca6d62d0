"""Adapter lifecycle over HTTP, driven by `loraserve adapters ... --server`: upload, use at once,
re-upload, delete; tenant scoping; and uploads the server refuses before storing anything."""

import json

import httpx
import pytest
from safetensors.torch import save
from typer.testing import CliRunner

from adapters.cli.commands import app
from adapters.format.base_model import BaseModelSpec
from tests.adapters.factory import TINY_SPEC, peft_adapter_files, peft_config, peft_tensors
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.api.served import ACME, ADMIN, GLOBEX, MODEL_ID, serve
from tests.serving.engine.world import base_model

runner = CliRunner()


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("adapters")) as s:
        yield s


def cli(served, key, *args):
    env = {"LORASERVE_API_KEY": key}
    return runner.invoke(app, [*args, "--server", served.url], env=env, catch_exceptions=False)


def complete(served, model, key=ACME):
    body = {"model": model, "prompt": "adapter test", "max_tokens": 5, "temperature": 0}
    auth = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{served.url}/v1/completions", json=body, headers=auth, timeout=30)


def want(served, adapter):
    return served.reference(served.text_ids("adapter test"), adapter, 5)[1]


def test_upload_use_reupload_delete(served):
    world = served.world
    done = cli(served, ACME, "upload", str(world.root / "qk"), "--name", "fresh")
    assert done.exit_code == 0, done.output
    first = done.stdout.strip().splitlines()[-1]
    assert first == f"fresh@{world.versions['qk'].split('@')[1]}"
    r = complete(served, "fresh")
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want(served, "qk")

    done = cli(served, ACME, "upload", str(world.root / "ov"), "--name", "fresh")
    assert done.exit_code == 0, done.output
    second = done.stdout.strip().splitlines()[-1]
    assert second != first
    r = complete(served, f"{MODEL_ID}:fresh")
    assert r.json()["choices"][0]["text"] == want(served, "ov")  # the new version at once

    shown = httpx.get(
        f"{served.url}/v1/adapters/fresh", headers={"Authorization": f"Bearer {ACME}"}
    )
    assert shown.json()["version"] == second and shown.json()["owner"] == "acme"
    assert set(shown.json()["history"]) == {first.split("@")[1], second.split("@")[1]}
    listed = cli(served, ACME, "list")
    assert "fresh" in listed.stdout and second.split("@")[1][:12] in listed.stdout
    assert first.split("@")[1] in cli(served, ACME, "show", "fresh").stdout

    done = cli(served, ACME, "delete", "fresh")
    assert done.exit_code == 0 and "deleted fresh" in done.stdout
    r = complete(served, "fresh")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_upload_with_a_draft_companion(world, served, tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    for name, data in peft_adapter_files(rank=2, seed=3).items():
        (draft / name).write_bytes(data)
    args = ("upload", str(world.root / "down"), "--name", "drafted", "--draft", str(draft))
    # A server without a draft model has nothing to check a companion against, nor to run it.
    done = cli(served, ACME, *args)
    assert done.exit_code == 1 and "this server runs no draft model" in done.output
    with serve(world, tmp_path / "drafting", draft_spec=TINY_SPEC) as drafting:
        done = cli(drafting, ACME, *args)
        assert done.exit_code == 0, done.output
        version = drafting.registry.resolve("drafted", "acme")
        assert drafting.registry.load(version.qualified).draft.rank == 2


def test_uploads_and_listings_name_the_lora_variants(served, tmp_path):
    folder, _ = save_peft_adapter(
        tmp_path / "dora", rank=4, modules=["q_proj", "v_proj"], base=base_model(), use_dora=True
    )
    files = {f.name: f.read_bytes() for f in folder.iterdir() if f.name.startswith("adapter_")}
    auth = {"Authorization": f"Bearer {ACME}"}
    r = httpx.post(f"{served.url}/v1/adapters", headers=auth, **upload_form(files, "dora-bot"))
    assert r.status_code == 201, r.text
    assert r.json()["variants"] == ["use_dora"]
    shown = httpx.get(f"{served.url}/v1/adapters/dora-bot", headers=auth).json()
    assert shown["variants"] == ["use_dora"]
    listed = httpx.get(f"{served.url}/v1/adapters", headers=auth).json()["data"]
    variants = {e["name"]: e["variants"] for e in listed}
    assert (variants["dora-bot"], variants["rot13"], variants["upper"]) == (
        ["use_dora"], ["use_rslora"], []
    )  # fmt: skip
    assert complete(served, "dora-bot").status_code == 200  # DoRA is served, not only stored
    assert "use_dora" in cli(served, ACME, "show", "dora-bot").stdout


def test_tenants_manage_only_their_own_adapters(served):
    root = served.world.root
    # names are per tenant: globex's "upper" is its own, and acme's stays acme's
    done = cli(served, GLOBEX, "upload", str(root / "qk"), "--name", "upper")
    assert done.exit_code == 0, done.output
    assert complete(served, "upper", key=GLOBEX).json()["choices"][0]["text"] == want(served, "qk")
    assert complete(served, "upper").json()["choices"][0]["text"] == want(served, "upper")
    listed = cli(served, GLOBEX, "list").stdout
    assert "upper" in listed and "rot13" not in listed
    assert cli(served, GLOBEX, "delete", "upper").exit_code == 0
    assert served.registry.exists("upper", "acme") and not served.registry.exists("upper", "globex")
    assert cli(served, GLOBEX, "show", "upper").exit_code == 1
    assert complete(served, "upper", key=GLOBEX).status_code == 404

    auth = {"Authorization": f"Bearer {GLOBEX}"}
    r = httpx.delete(f"{served.url}/v1/adapters/upper", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert served.registry.exists("upper", "acme")

    # the admin names the tenant to publish for or delete from; the owner stays
    admin = {"Authorization": f"Bearer {ADMIN}"}
    r = httpx.delete(f"{served.url}/v1/adapters/upper?tenant=acme", headers=admin)
    assert r.status_code == 200 and not served.registry.exists("upper", "acme")


def test_server_errors_print_one_line(served):
    done = cli(served, "wrong-key", "list")
    assert done.exit_code == 1 and done.stderr.strip() == "error: invalid API key"
    done = cli(served, ACME, "show", "nobody")
    assert done.exit_code == 1 and "unknown adapter 'nobody'" in done.stderr
    done = runner.invoke(app, ["list", "--server", "http://127.0.0.1:9"], env={})
    assert done.exit_code == 1 and "cannot reach the server at http://127.0.0.1:9" in done.stderr


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_another_tenants_adapter_answers_as_a_missing_one(served, method):
    def ask(name):
        auth = {"Authorization": f"Bearer {GLOBEX}"}
        r = httpx.request(method, f"{served.url}/v1/adapters/{name}", headers=auth)
        return r.status_code, r.headers.get("content-type"), r.text.replace(name, "NAME")

    assert served.registry.resolve("rot13", "acme").owner == "acme"
    assert ask("rot13") == ask("rot14")  # acme's, and nobody's
    assert ask("rot13")[0] == 404 and served.registry.exists("rot13", "acme")


def wrong_shapes() -> dict[str, bytes]:
    other = BaseModelSpec.from_config(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
        }
    )
    return {
        "adapter_config.json": json.dumps(peft_config(rank=4)).encode(),
        "adapter_model.safetensors": save(peft_tensors(rank=4, spec=other)),
    }


def upload_form(files: dict[str, bytes], name="new-one") -> dict:
    return {"data": {"name": name}, "files": {k: (k, v) for k, v in files.items()}}


BAD_UPLOADS = [  # (id, form, status, message)
    ("wrong-shapes", lambda: upload_form(wrong_shapes()), 400, "shape"),
    ("missing-weights", lambda: upload_form({"adapter_config.json": b"{}"}), 400,
     "adapter_model.safetensors"),
    ("pickle-weights", lambda: upload_form({"adapter_config.json": b"{}",
                                            "adapter_model.bin": b"\x80\x04"}), 400,
     "adapter_model.bin is pickle and is refused; save with"),
    ("bad-name", lambda: upload_form(peft_adapter_files(), name="Bad Name"), 400,
     "invalid adapter name"),
    ("reserved-name", lambda: upload_form(peft_adapter_files(), name="base"), 400, "reserved"),
    ("newline-name", lambda: upload_form(peft_adapter_files(), name="x\n"), 400,
     "invalid adapter name"),
    ("rank-too-high", lambda: upload_form(peft_adapter_files(rank=32)), 400, "max_lora_rank"),
    ("config-not-json", lambda: upload_form({**peft_adapter_files(), "adapter_config.json": b"{"}),
     400, "not valid JSON"),
    ("half-a-draft", lambda: upload_form({**peft_adapter_files(),
                                          "draft_adapter_config.json": b"{}"}), 400, "both"),
    ("no-name", lambda: {"files": upload_form(peft_adapter_files())["files"]}, 400, "name"),
    ("nested-config", lambda: upload_form({**peft_adapter_files(), "adapter_config.json":
                                           b"[" * 50_000 + b"]" * 50_000}), 400, "nests deeper"),
    ("nested-header", lambda: upload_form({**peft_adapter_files(), "adapter_model.safetensors":
                                           nested_safetensors()}), 400, "nests deeper"),
    ("long-number", lambda: upload_form({**peft_adapter_files(), "adapter_config.json":
                                         b'{"r": ' + b"9" * 5000 + b"}"}), 400, "adapter"),
]  # fmt: skip


def nested_safetensors() -> bytes:
    header = b"[" * 50_000 + b"]" * 50_000
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize(("form", "status", "message"), [b[1:] for b in BAD_UPLOADS],
                         ids=[b[0] for b in BAD_UPLOADS])  # fmt: skip
def test_bad_uploads_are_refused_and_store_nothing(served, form, status, message):
    before = served.registry.list()
    r = httpx.post(f"{served.url}/v1/adapters", headers={"Authorization": f"Bearer {ACME}"},
                   **form())  # fmt: skip
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert served.registry.list() == before
