"""Loading and validating PEFT LoRA adapters: PEFT's own files round-trip, bad ones are refused."""

import io
import json
import tarfile
import zipfile

import pytest
import torch

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter, parse_adapter
from adapters.format.base_model import BaseModelSpec
from tests.adapters.factory import TINY_SPEC, peft_adapter_files, peft_tensors
from tests.adapters.malformed import MALFORMED, with_tensors
from tests.adapters.peft_models import save_base, save_peft_adapter

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@pytest.mark.parametrize(
    ("rank", "modules", "rslora"),
    [
        (4, ("q_proj", "v_proj"), False),
        (16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), False),
        (8, ("down_proj",), True),
        (1, ("k_proj", "up_proj"), False),
    ],
)
def test_peft_adapters_round_trip(tmp_path, rank, modules, rslora):
    path, model = save_peft_adapter(tmp_path / "a", rank=rank, modules=modules, rslora=rslora)
    base = BaseModelSpec.from_dir(save_base(tmp_path / "base"))
    adapter = load_adapter(path, base=base)
    assert adapter.rank == rank and adapter.target_modules == tuple(sorted(modules))
    peft_layers = {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {})
    }
    assert len(adapter.modules) == len(peft_layers) == len(modules) * base.num_layers
    for name, layer in peft_layers.items():
        index = int(name.split("layers.")[1].split(".")[0])
        got = adapter.modules[(index, name.rsplit(".", 1)[1])]
        assert torch.equal(got.a, layer.lora_A["default"].weight.detach())
        assert torch.equal(got.b, layer.lora_B["default"].weight.detach())
        assert adapter.scale == pytest.approx(layer.scaling["default"])


def test_sources_agree(tmp_path):
    files = peft_adapter_files()
    folder = tmp_path / "dir"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as t:
        t.add(folder, arcname="my-adapter")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    digests = {
        load_adapter(src).digest
        for src in (folder, tmp_path / "a.tar.gz", tmp_path / "a.zip", files)
    }
    assert len(digests) == 1


def test_digest_is_content():
    a = parse_adapter(peft_adapter_files(seed=1))
    assert parse_adapter(peft_adapter_files(seed=1)).digest == a.digest
    assert parse_adapter(peft_adapter_files(seed=2)).digest != a.digest
    with_draft = parse_adapter(
        peft_adapter_files(seed=1), draft=parse_adapter(peft_adapter_files(seed=3))
    )
    assert with_draft.digest != a.digest and with_draft.draft.rank == 8


def test_no_model_type_and_other_base_name_only_warn():
    files = peft_adapter_files(base_model_name_or_path="meta-llama/Llama-3.1-8B")
    assert "model_type" not in json.loads(files[CONFIG])
    adapter = parse_adapter(files, base=TINY_SPEC, base_name="demo")
    assert len(adapter.warnings) == 1 and "meta-llama/Llama-3.1-8B" in adapter.warnings[0]


def test_checks_needing_no_base_run_without_one():
    files = peft_adapter_files()
    parse_adapter(files)  # no base: shapes are not checked, structure is
    with pytest.raises(AdapterError, match="rank 8 is above"):
        parse_adapter(files, max_rank=4)


@pytest.mark.parametrize(
    ("files", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_adapters_are_refused_each_with_its_message(files, message):
    with pytest.raises(AdapterError, match=message):
        parse_adapter(files(), base=TINY_SPEC)


def test_messages_are_distinct():
    messages = set()
    for _, files, _ in MALFORMED:
        with pytest.raises(AdapterError) as info:
            parse_adapter(files(), base=TINY_SPEC)
        messages.add(str(info.value))
    assert len(messages) >= len(MALFORMED) - 1  # NaN and Inf share a message


def test_size_limit(tmp_path):
    with pytest.raises(AdapterError, match="over the limit of 1000 bytes"):
        load_adapter(peft_adapter_files(), max_bytes=1000)


@pytest.mark.parametrize("archive", ["a.zip", "a.tar.gz"])
def test_archive_without_weights_and_garbage_archive(tmp_path, archive):
    path = tmp_path / archive
    if archive.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x/adapter_config.json", peft_adapter_files()[CONFIG])
    else:
        with tarfile.open(path, "w:gz") as t:
            info = tarfile.TarInfo("adapter_config.json")
            data = peft_adapter_files()[CONFIG]
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors is missing"):
        load_adapter(path)
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(AdapterError, match="not a readable archive"):
        load_adapter(tmp_path / "bad.zip")


def test_a_link_or_a_folder_in_place_of_a_file_is_named(tmp_path):
    path = tmp_path / "linked.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo("x/adapter_config.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    with pytest.raises(AdapterError, match=r"'x/adapter_config\.json' is a link"):
        load_adapter(path)
    folder = tmp_path / "folder"
    (folder / CONFIG).mkdir(parents=True)
    with pytest.raises(AdapterError, match=r"adapter_config\.json: not a file"):
        load_adapter(folder)


def test_missing_path():
    with pytest.raises(AdapterError, match="no such file or folder"):
        load_adapter("/nonexistent/adapter")


def test_duplicate_and_misplaced_tensors_are_refused():
    t = peft_tensors()
    name = next(k for k in t if "q_proj.lora_A" in k)
    dup = {**t, name.replace("base_model.model.", ""): t[name].clone()}
    with pytest.raises(AdapterError, match="repeats layer 0 q_proj lora_A"):
        parse_adapter(with_tensors(dup))
    moved = {k.replace("self_attn.q_proj", "mlp.q_proj"): v for k, v in t.items()}
    with pytest.raises(AdapterError, match="puts q_proj under mlp"):
        parse_adapter(with_tensors(moved))


@pytest.mark.parametrize("field", ["num_attention_heads", "hidden_size", "num_hidden_layers"])
def test_base_config_sizes_must_be_positive(field):
    from adapters.format.base_model import BaseModelSpec
    from tests.adapters.factory import TINY_BASE

    with pytest.raises(AdapterError, match=f"{field} must be positive"):
        BaseModelSpec.from_config({**TINY_BASE, field: 0})
