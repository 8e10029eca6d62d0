"""Model folders and URIs, and safetensors checkpoints (single file and sharded) as saved."""

import json
import re
import shutil

import fsspec
import pytest
import torch

from serving.model.checkpoint import load_state_dict, resolve_model_path
from serving.model.errors import ModelLoadError
from tests.serving.model.hf_folders import save_tiny_model


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tiny Llama saved in 20 KB shards, and its state dict."""
    folder = tmp_path_factory.mktemp("sharded")
    model = save_tiny_model(folder, "llama", shard="20KB")
    return folder, model.state_dict()


def test_single_file_round_trip(tmp_path):
    model = save_tiny_model(tmp_path, "qwen2", dtype=torch.bfloat16)
    assert (tmp_path / "model.safetensors").is_file()
    state = load_state_dict(tmp_path)
    expected = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert state[name].dtype == torch.bfloat16 and torch.equal(state[name], tensor), name
    assert "model.layers.0.self_attn.q_proj.bias" in state  # Qwen2's q/k/v bias


def test_tied_embeddings_are_saved_once(tmp_path):
    save_tiny_model(tmp_path, "llama", tie_word_embeddings=True)
    state = load_state_dict(tmp_path)
    assert "model.embed_tokens.weight" in state and "lm_head.weight" not in state


def test_sharded_round_trip(sharded):
    folder, expected = sharded
    shards = sorted(p.name for p in folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    state = load_state_dict(folder)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[n], t) for n, t in expected.items())


def _copy(sharded, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(sharded[0], folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder, index


def test_missing_shard_is_named(sharded, tmp_path):
    folder, index = _copy(sharded, tmp_path)
    shard = sorted(set(index["weight_map"].values()))[1]
    (folder / shard).unlink()
    with pytest.raises(ModelLoadError, match=re.escape(f"shard {shard} is missing")):
        load_state_dict(folder)


def test_weight_map_naming_an_unknown_file(sharded, tmp_path):
    folder, index = _copy(sharded, tmp_path)
    index["weight_map"]["lm_head.weight"] = "model-00009-of-00009.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model-00009-of-00009\.safetensors is missing"):
        load_state_dict(folder)


def test_weight_map_naming_a_tensor_its_shard_lacks(sharded, tmp_path):
    folder, index = _copy(sharded, tmp_path)
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["model.extra.weight"] = first
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        ModelLoadError, match=re.escape(f"tensor model.extra.weight is not in shard {first}")
    ):
        load_state_dict(folder)


def test_shard_outside_the_folder_is_refused(sharded, tmp_path):
    folder, index = _copy(sharded, tmp_path)
    index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="is not a file in the folder"):
        load_state_dict(folder)


def test_pickle_only_is_refused_with_a_way_out(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"refusing pickle weights pytorch_model\.bin") as err:
        load_state_dict(tmp_path)
    assert "safetensors" in str(err.value) and "save_pretrained" in str(err.value)


def test_no_weights_and_corrupt_weights(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no model\.safetensors"):
        load_state_dict(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_state_dict(tmp_path)


def test_local_folder_is_returned_as_is(tmp_path):
    assert resolve_model_path(tmp_path, tmp_path / "cache") == tmp_path
    assert resolve_model_path(str(tmp_path), tmp_path / "cache") == tmp_path
    assert not (tmp_path / "cache").exists()
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model_path(tmp_path / "absent", tmp_path / "cache")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelLoadError, match="is not a folder"):
        resolve_model_path(tmp_path / "file", tmp_path / "cache")


def test_uri_is_copied_once_then_reused(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/models/tiny/config.json": b"{}", "/models/tiny/sub/tokenizer.json": b"[]"})
    try:
        local = resolve_model_path("memory://models/tiny", tmp_path / "cache")
        assert local.parent == tmp_path / "cache" and len(local.name) == 64
        assert (local / "config.json").read_bytes() == b"{}"
        assert (local / "sub" / "tokenizer.json").read_bytes() == b"[]"
        fs.pipe("/models/tiny/config.json", b'{"changed": 1}')
        assert resolve_model_path("memory://models/tiny", tmp_path / "cache") == local
        assert (local / "config.json").read_bytes() == b"{}"  # reused, not copied again
        left = sorted(p.name for p in (tmp_path / "cache").iterdir())
        assert left == [local.name, f"{local.name}.lock"]  # no partial copies left
        with pytest.raises(ModelLoadError, match="memory://models/absent: not found"):
            resolve_model_path("memory://models/absent", tmp_path / "cache")
    finally:
        fs.rm("/models", recursive=True)


def test_file_uri_of_a_saved_model(sharded, tmp_path):
    local = resolve_model_path(f"file://{sharded[0]}", tmp_path / "cache")
    assert local != sharded[0]
    assert load_state_dict(local).keys() == sharded[1].keys()


def test_processes_starting_together_copy_a_uri_once(tmp_path, monkeypatch):
    import threading
    import time

    from serving.model import checkpoint

    fs = fsspec.filesystem("memory")
    fs.pipe({"/models/together/config.json": b"{}"})
    copies, real_copy = [], checkpoint._copy_tree

    def slow_copy(*args):
        copies.append(1)
        time.sleep(0.3)  # a large model: the others arrive while it copies
        real_copy(*args)

    monkeypatch.setattr(checkpoint, "_copy_tree", slow_copy)
    got = []
    try:
        threads = [
            threading.Thread(target=lambda: got.append(
                resolve_model_path("memory://models/together", tmp_path / "cache")))
            for _ in range(4)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        fs.rm("/models/together", recursive=True)
    assert len(copies) == 1 and len(set(got)) == 1 and len(got) == 4
    assert (got[0] / "config.json").read_bytes() == b"{}"
