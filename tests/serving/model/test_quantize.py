"""`loraserve quantize` writes a compressed-tensors FP8 checkpoint that loads as FP8 without
quantizing again, here and in transformers; what it wrote before (loraserve-fp8) still loads."""

import json

import pytest
import torch
from typer.testing import CliRunner

from serving.cli import app
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.quantize import is_quantized_linear, quantize_checkpoint
from serving.model.step_plan import plan_step
from tests.serving.model.fp8_checkpoints import dequantized_reference
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for


def test_quantized_checkpoint_loads_as_the_same_fp8_model(tmp_path):
    src, _ = save_tiny("qwen2", tmp_path / "src")
    done = CliRunner().invoke(app, ["quantize", str(src), str(tmp_path / "dst")])
    assert done.exit_code == 0, done.output
    dst = tmp_path / "dst"
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    # as llm-compressor writes FP8-dynamic: every Linear but those ignored (vLLM reads it so)
    assert config["quantization_config"]["config_groups"]["group_0"]["targets"] == ["Linear"]
    state = load_state_dict(dst)
    assert state["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert state["model.layers.0.self_attn.q_proj.weight_scale"].shape == (48, 1)
    assert state["model.embed_tokens.weight"].dtype == torch.float32  # stays high precision
    assert state["model.layers.0.self_attn.q_proj.bias"].dtype == torch.float32

    prequantized = LlamaModel(load_model_config(dst), state, fp8=True, dtype=torch.float32)
    on_the_fly = LlamaModel(
        load_model_config(src), load_state_dict(src), fp8=True, dtype=torch.float32
    )
    assert torch.equal(
        prequantized.layers[1].qkv.weight.view(torch.uint8),
        on_the_fly.layers[1].qkv.weight.view(torch.uint8),
    )
    logits = []
    for model in (prequantized, on_the_fly):
        seqs = [Seq([3, 1, 4, 1, 5, 9, 2, 6])]
        logits.append(
            model.forward(plan_step(step_for(seqs, 4, BlockPool(8)), model.allocate_kv(8, 4)))
        )
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_quantize_refuses_twice_and_a_non_empty_destination(tmp_path):
    src, _ = save_tiny("llama", tmp_path / "src")
    runner = CliRunner()
    assert runner.invoke(app, ["quantize", str(src), str(tmp_path / "q")]).exit_code == 0
    again = runner.invoke(app, ["quantize", str(tmp_path / "q"), str(tmp_path / "q2")])
    assert again.exit_code == 1 and "already quantized" in again.stderr
    busy = runner.invoke(app, ["quantize", str(src), str(tmp_path / "q")])
    assert busy.exit_code == 1 and "is not empty" in busy.stderr
    missing = runner.invoke(app, ["quantize", str(tmp_path / "nope"), str(tmp_path / "q3")])
    assert missing.exit_code == 1 and "not found" in missing.stderr


def test_a_quantized_mixture_of_experts_loads_its_experts_as_fp8(tmp_path):
    src, _ = save_tiny("qwen3_moe", tmp_path / "src")
    done = CliRunner().invoke(app, ["quantize", str(src), str(tmp_path / "dst")])
    assert done.exit_code == 0, done.output
    state = load_state_dict(tmp_path / "dst")
    assert state["model.layers.0.mlp.experts.5.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert state["model.layers.0.mlp.gate.weight"].dtype == torch.float32  # the router is not
    prequantized = LlamaModel(load_model_config(tmp_path / "dst"), state, fp8=True,
                              dtype=torch.float32)  # fmt: skip
    on_the_fly = LlamaModel(load_model_config(src), load_state_dict(src), fp8=True,
                            dtype=torch.float32)  # fmt: skip
    for name in ("gate_up", "down", "gate_up_scale", "down_scale"):
        a, b = (getattr(m.layers[1].experts, name) for m in (prequantized, on_the_fly))
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b), name  # fmt: skip


def test_quantized_checkpoint_loads_in_transformers_as_the_same_weights(tmp_path):
    src, _ = save_tiny("qwen2", tmp_path / "src")
    quantize_checkpoint(src, tmp_path / "dst", show_progress=False)
    reference = dequantized_reference(tmp_path / "dst")  # read by compressed-tensors
    ours = LlamaModel(load_model_config(tmp_path / "dst"), load_state_dict(tmp_path / "dst"),
                      fp8=True, dtype=torch.float32)  # fmt: skip
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    got = ours.forward(plan_step(step_for([Seq(tokens)], 4, BlockPool(8)), ours.allocate_kv(8, 4)))
    with torch.no_grad():
        want = reference(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got.view(len(tokens), -1), want, rtol=1e-4, atol=1e-4)


def test_a_checkpoint_in_the_earlier_loraserve_fp8_format_still_loads(tmp_path):
    src, _ = save_tiny("llama", tmp_path / "src")
    quantize_checkpoint(src, tmp_path / "dst", show_progress=False)
    state = load_state_dict(tmp_path / "dst")
    earlier = {k: v.reshape(-1) if k.endswith("weight_scale") else v for k, v in state.items()}
    raw = json.loads((tmp_path / "dst" / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "loraserve-fp8", "weight_dtype": "float8_e4m3fn"}
    (tmp_path / "dst" / "config.json").write_text(json.dumps(raw))
    config = load_model_config(tmp_path / "dst")
    now, before = (LlamaModel(config, s, fp8=True, dtype=torch.float32) for s in (state, earlier))
    for a, b in (
        (now.layers[1].qkv, before.layers[1].qkv),
        (now.layers[0].down, before.layers[0].down),
    ):
        assert torch.equal(a.scale, b.scale) and a.scale.shape == (a.weight.shape[0],)
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))


@pytest.mark.parametrize(
    ("name", "quantized"),
    [
        ("model.layers.0.self_attn.q_proj.weight", True),
        ("model.language_model.layers.3.mlp.down_proj.weight", True),
        ("model.layers.0.mlp.experts.7.up_proj.weight", True),
        ("model.layers.0.self_attn.qkv_proj.weight", True),
        ("model.layers.0.self_attn.q_proj.bias", False),
        ("model.layers.0.mlp.gate.weight", False),  # a router: ignored
        ("lm_head.weight", False),
        ("model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", False),
        ("model.multi_modal_projector.mm_input_projection_weight", False),
    ],
)
def test_what_quantize_writes_in_fp8_is_what_its_config_does_not_ignore(name, quantized):
    assert is_quantized_linear(name) is quantized
