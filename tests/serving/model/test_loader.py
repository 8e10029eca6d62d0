"""load_model: a folder or fsspec URI with config, weights and tokenizer, under each quantization."""

import fsspec
import pytest
import torch

from serving.model.errors import ModelLoadError
from serving.model.loader import load_model
from serving.model.step_plan import plan_step
from tests.serving.model.hf_folders import save_tokenizer
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for


@pytest.fixture
def folder(tmp_path):
    path, _ = save_tiny("llama", tmp_path / "m", vocab_size=1024)
    save_tokenizer(path, "byte_level_bpe")
    return path


def _logits(loaded, text="def f(x): return x"):
    ids = loaded.tokenizer.encode(text)
    model = loaded.model
    return model.forward(
        plan_step(step_for([Seq(ids)], 4, BlockPool(32)), model.allocate_kv(32, 4))
    )


def test_quantization_modes_on_cpu(folder, tmp_path):
    plain = load_model(folder, quantization="none", cache_dir=tmp_path / "c")
    auto = load_model(folder, quantization="auto", cache_dir=tmp_path / "c")
    fp8 = load_model(folder, quantization="fp8", cache_dir=tmp_path / "c")
    assert plain.model.layers[0].qkv.weight.dtype == torch.float32
    assert auto.model.layers[0].qkv.weight.dtype == torch.float32  # no FP8 tensor cores on a CPU
    assert fp8.model.layers[0].qkv.weight.dtype == torch.float8_e4m3fn
    assert (
        fp8.model.embed.dtype == torch.float32
    )  # embeddings, norms and LM head stay high precision
    torch.testing.assert_close(_logits(plain), _logits(auto))
    assert (_logits(fp8) - _logits(plain)).abs().max() > 0


def test_bfloat16_dtype_and_an_fsspec_uri(folder, tmp_path):
    fs = fsspec.filesystem("memory")
    for f in folder.iterdir():
        fs.pipe_file(f"/models/m/{f.name}", f.read_bytes())
    loaded = load_model("memory://models/m", dtype="bfloat16", cache_dir=tmp_path / "cache")
    assert loaded.model.embed.dtype == torch.bfloat16
    assert loaded.path.is_relative_to(tmp_path / "cache")
    assert torch.isfinite(_logits(loaded)).all()
    fs.rm("/models", recursive=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantization": "int4"}, "model.quantization: expected one of"),
        ({"dtype": "float64"}, "model.dtype: expected auto or one of"),
    ],
)
def test_bad_settings(folder, kwargs, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(folder, **kwargs)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    path, _ = save_tiny("llama", tmp_path / "m")  # 211 embeddings
    save_tokenizer(path, "byte_level_bpe")
    with pytest.raises(ModelLoadError, match="token ids up to"):
        load_model(path)


def test_prequantized_checkpoint_refuses_none(folder, tmp_path):
    from serving.model.quantize import quantize_checkpoint

    quantize_checkpoint(folder, tmp_path / "q", show_progress=False)
    with pytest.raises(ModelLoadError, match="the checkpoint is FP8"):
        load_model(tmp_path / "q", quantization="none")
    assert load_model(tmp_path / "q").model.layers[0].qkv.weight.dtype == torch.float8_e4m3fn
