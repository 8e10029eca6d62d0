"""`loraserve adapters ...` against a registry folder, as a user runs it."""

import json
import re

import pytest
from typer.testing import CliRunner

from serving.cli import app
from tests.adapters.factory import TINY_BASE, peft_adapter_files
from tests.adapters.malformed import MALFORMED
from tests.adapters.peft_models import save_peft_adapter

runner = CliRunner()


@pytest.fixture
def base_dir(tmp_path):
    path = tmp_path / "base"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY_BASE))
    return path


def write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def snapshot(root):
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def cli(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def upload_as_each(folder, reg: str, name: str, tenants) -> None:
    """folder uploaded as name into reg once for each tenant."""
    for tenant in tenants:
        done = cli("adapters", "upload", str(folder), "--name", name, "--registry", reg,
                   "--tenant", tenant)  # fmt: skip
        assert done.exit_code == 0, done.output


def test_upload_list_show_delete(tmp_path, base_dir):
    reg = f"file://{tmp_path / 'reg'}"
    adapter = write(tmp_path / "a", peft_adapter_files(seed=1))
    done = cli(
        "adapters",
        "upload",
        str(adapter),
        "--name",
        "support-bot",
        "--base",
        str(base_dir),
        "--registry",
        reg,
    )
    assert done.exit_code == 0, done.output
    ref = done.stdout.strip().splitlines()[-1]
    assert ref.startswith("support-bot@") and len(ref.split("@")[1]) == 64

    again = cli("adapters", "upload", str(adapter), "--name", "support-bot", "--registry", reg)
    assert again.stdout.strip().splitlines()[-1] == ref  # identical content: the same version

    listed = cli("adapters", "list", "--registry", reg)
    assert "support-bot" in listed.stdout and ref.split("@")[1][:12] in listed.stdout
    shown = cli("adapters", "show", "support-bot", "--registry", reg)
    assert ref.split("@")[1] in shown.stdout and "q_proj, v_proj" in shown.stdout

    assert cli("adapters", "delete", "support-bot", "--registry", reg).exit_code == 0
    gone = cli("adapters", "show", "support-bot", "--registry", reg)
    assert gone.exit_code == 1 and "unknown adapter 'support-bot'" in gone.stderr


def test_show_and_list_name_the_lora_variants(tmp_path):
    reg = f"file://{tmp_path / 'reg'}"
    dora, _ = save_peft_adapter(
        tmp_path / "d", rank=4, modules=["q_proj"], use_dora=True, rslora=True
    )
    for name, folder in (("dora", dora), ("plain", write(tmp_path / "p", peft_adapter_files()))):
        done = cli("adapters", "upload", str(folder), "--name", name, "--registry", reg)
        assert done.exit_code == 0, done.output
    shown = cli("adapters", "show", "dora", "--registry", reg).stdout
    assert re.search(r"^variants +use_dora, use_rslora$", shown, re.M), shown
    shown = cli("adapters", "show", "plain", "--registry", reg).stdout
    assert re.search(r"^variants +plain LoRA$", shown, re.M), shown
    listed = cli("adapters", "list", "--registry", reg).stdout
    header, dora_row, plain_row = listed.splitlines()[:3]
    assert header.split()[5] == "variants", listed  # an 80-column table may cut the cells
    assert dora_row.split()[4].startswith("use_dora,")
    assert plain_row.split()[4].startswith("q_proj")  # its variants cell is empty


def test_upload_with_draft_and_archive(tmp_path):
    import tarfile

    reg = f"file://{tmp_path / 'reg'}"
    folder = write(tmp_path / "a", peft_adapter_files(seed=4))
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as t:
        t.add(folder, arcname="a")
    draft = write(tmp_path / "d", peft_adapter_files(rank=4, seed=5))
    done = cli(
        "adapters",
        "upload",
        str(tmp_path / "a.tar.gz"),
        "--name",
        "x",
        "--draft",
        str(draft),
        "--registry",
        reg,
    )
    assert done.exit_code == 0, done.output
    from adapters.registry.registry import Registry

    loaded = Registry(reg).load("x")
    assert loaded.draft is not None and loaded.draft.rank == 4


@pytest.mark.parametrize(
    ("files", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_upload_fails_in_one_line_and_stores_nothing(tmp_path, base_dir, files, message):
    reg_dir = tmp_path / "reg"
    reg = f"file://{reg_dir}"
    ok = write(tmp_path / "ok", peft_adapter_files(seed=9))
    assert cli("adapters", "upload", str(ok), "--name", "kept", "--registry", reg).exit_code == 0
    before = snapshot(reg_dir)

    bad = write(tmp_path / "bad", files())
    done = cli(
        "adapters", "upload", str(bad), "--name", "new", "--base", str(base_dir), "--registry", reg
    )
    assert done.exit_code == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert re.search(message, " ".join(done.stderr.split())), done.stderr
    assert "Traceback" not in done.output
    assert snapshot(reg_dir) == before


@pytest.mark.parametrize("name", ["Bad", "../up", "a:b", "x" * 65, "base", ""])
def test_bad_names_are_refused(tmp_path, name):
    reg_dir = tmp_path / "reg"
    folder = write(tmp_path / "a", peft_adapter_files())
    done = cli("adapters", "upload", str(folder), "--name", name, "--registry", f"file://{reg_dir}")
    assert done.exit_code == 1 and "invalid adapter name" in done.stderr
    assert not snapshot(reg_dir) if reg_dir.exists() else True


def test_without_registry_the_default_server_is_asked(monkeypatch):
    import adapters.cli.commands

    monkeypatch.setattr(
        adapters.cli.commands, "DEFAULT_SERVER", "http://127.0.0.1:9"
    )  # nothing listens
    done = cli("adapters", "list")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.exit_code == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot reach the server at http://127.0.0.1:9")


def test_registry_and_server_together_are_refused(tmp_path):
    done = cli("adapters", "list", "--registry", str(tmp_path), "--server", "http://x")
    assert done.exit_code == 1 and "either --registry or --server" in done.stderr


def test_a_corrupted_entry_is_left_out_of_the_list_and_shown_in_one_line(tmp_path):
    reg_dir = tmp_path / "reg"
    for name, seed in (("a", 1), ("b", 2)):
        folder = write(tmp_path / name, peft_adapter_files(seed=seed))
        upload = cli("adapters", "upload", str(folder), "--name", name, "--registry", str(reg_dir))
        assert upload.exit_code == 0, upload.output
    (reg_dir / "tenants" / "default" / "names" / "a" / "latest.json").write_text("{not json")
    listed = cli("adapters", "list", "--registry", str(reg_dir))
    assert listed.exit_code == 0, listed.output
    assert " b " in listed.stdout and " a " not in listed.stdout
    done = cli("adapters", "show", "a", "--registry", str(reg_dir))
    assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1, done.output
    assert "corrupted" in done.stderr


def test_tenants(tmp_path):
    reg = f"file://{tmp_path / 'reg'}"
    folder = write(tmp_path / "a", peft_adapter_files(seed=3))
    upload_as_each(folder, reg, "bot", ("acme", "globex"))
    listed = cli("adapters", "list", "--registry", reg)
    assert "acme" in listed.stdout and "globex" in listed.stdout
    only = cli("adapters", "list", "--registry", reg, "--tenant", "acme")
    assert "acme" in only.stdout and "globex" not in only.stdout
    shown = cli("adapters", "show", "bot", "--registry", reg, "--tenant", "globex")
    assert shown.exit_code == 0 and "globex" in shown.stdout
    assert cli("adapters", "show", "bot", "--registry", reg).exit_code == 1  # not "default"'s
    assert cli("adapters", "delete", "bot", "--registry", reg, "--tenant", "acme").exit_code == 0
    gone = cli("adapters", "show", "bot", "--registry", reg, "--tenant", "acme")
    assert gone.exit_code == 1 and "unknown adapter 'bot'" in gone.stderr
    bad = cli(
        "adapters", "upload", str(folder), "--name", "x", "--registry", reg, "--tenant", "a b"
    )
    assert bad.exit_code == 1 and "invalid tenant" in bad.stderr


def test_public(tmp_path):
    reg = f"file://{tmp_path / 'reg'}"
    folder = write(tmp_path / "a", peft_adapter_files(seed=7))
    upload_as_each(folder, reg, "bot", ("acme", "globex"))
    done = cli("adapters", "public", "bot", "--registry", reg, "--tenant", "acme")
    assert done.exit_code == 0 and done.stdout.strip() == "bot is public (owner acme)"
    shown = cli("adapters", "show", "bot", "--registry", reg, "--tenant", "acme")
    assert re.search(r"^public\s+yes$", shown.stdout, re.M), shown.stdout
    rows = [line.split() for line in cli("adapters", "list", "--registry", reg).stdout.splitlines()]
    public = {row[2]: row[3] == "yes" for row in rows if row[:1] == ["bot"]}
    assert public == {"acme": True, "globex": False}

    # one public adapter per name: globex's "bot" cannot be made public beside acme's
    clash = cli("adapters", "public", "bot", "--registry", reg, "--tenant", "globex")
    assert clash.exit_code == 1 and len(clash.stderr.strip().splitlines()) == 1, clash.output
    assert clash.stderr.startswith("error: ")

    off = cli("adapters", "public", "bot", "--off", "--registry", reg, "--tenant", "acme")
    assert off.exit_code == 0 and off.stdout.strip() == "bot is private (owner acme)"
    from adapters.registry.registry import Registry

    assert Registry(reg).public_owner("bot") is None
    missing = cli("adapters", "public", "nobody", "--registry", reg)
    assert missing.exit_code == 1 and "unknown adapter 'nobody'" in missing.stderr


def test_gc(tmp_path):
    reg = f"file://{tmp_path / 'reg'}"
    folder = write(tmp_path / "a", peft_adapter_files(seed=6))
    ref = cli("adapters", "upload", str(folder), "--name", "x", "--registry", reg).stdout
    digest = ref.strip().splitlines()[-1].split("@")[1]
    kept = cli("adapters", "gc", "--registry", reg, "--grace-hours", "0")
    assert kept.exit_code == 0 and "removed 0 unused version(s)" in kept.stdout
    assert cli("adapters", "delete", "x", "--registry", reg).exit_code == 0
    dry = cli("adapters", "gc", "--registry", reg, "--grace-hours", "0", "--dry-run")
    assert dry.exit_code == 0 and f"would remove {digest}" in dry.stdout
    assert (tmp_path / "reg" / "versions" / digest).is_dir()
    within = cli("adapters", "gc", "--registry", reg)  # the default grace: a day
    assert within.exit_code == 0 and digest not in within.stdout
    done = cli("adapters", "gc", "--registry", reg, "--grace-hours", "0")
    assert done.exit_code == 0 and f"removed {digest}" in done.stdout
    assert not (tmp_path / "reg" / "versions" / digest).exists()
    failed = cli("adapters", "gc", "--registry", "nosuchprotocol://x")
    assert failed.exit_code == 1 and len(failed.stderr.strip().splitlines()) == 1
    assert failed.stderr.startswith("error: ")


def test_garbage_archive_is_one_line(tmp_path):
    (tmp_path / "a.tar.gz").write_bytes(b"\x1f\x8b garbage")
    done = cli(
        "adapters",
        "upload",
        str(tmp_path / "a.tar.gz"),
        "--name",
        "a",
        "--registry",
        str(tmp_path / "r"),
    )
    assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1, done.output
    assert "not a readable archive" in done.stderr


def test_a_warning_is_one_line_however_narrow_the_terminal(tmp_path, base_dir):
    files = peft_adapter_files(seed=2)
    config = json.loads(files["adapter_config.json"])
    config["base_model_name_or_path"] = "some-org/a-base-model-with-a-rather-long-name-" + "x" * 40
    files["adapter_config.json"] = json.dumps(config).encode()
    adapter = write(tmp_path / "w", files)
    done = runner.invoke(
        app,
        ["adapters", "upload", str(adapter), "--name", "warned", "--base", str(base_dir),
         "--registry", f"file://{tmp_path / 'reg'}"],
        env={"COLUMNS": "60"},
        catch_exceptions=False,
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    warned = [line for line in done.stderr.splitlines() if "trained on" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "its shapes fit" in warned[0]
