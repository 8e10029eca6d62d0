"""config.json -> ModelConfig: what transformers 5 writes, the transformers 4 layout, refusals."""

import re

import pytest
import torch
from transformers import AutoConfig

from serving.model.errors import ModelLoadError
from serving.model.hf_config import load_model_config
from serving.model.rope_config import RopeScaling
from tests.serving.model.hf_folders import (
    TINY,
    save_generation_config,
    save_tiny_model,
    write_config,
)
from tests.serving.model.hf_models import save_tiny

V4_BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "eos_token_id": 2,
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # fmt: skip
V4_ROPE = {
    "plain": {"rope_theta": 500000.0, "rope_scaling": None},
    "linear-type": {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
    "llama3": {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},
    "yarn": {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 64}},
}  # fmt: skip


def test_llama_saved_by_transformers(tmp_path):
    save_tiny_model(tmp_path, "llama", dtype=torch.bfloat16, eos_token_id=2)
    c = load_model_config(tmp_path)
    assert (c.architecture, c.hidden_size, c.intermediate_size, c.num_layers) == (
        "LlamaForCausalLM", 64, 96, 2)  # fmt: skip
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (4, 2, 16, 128)
    assert c.torch_dtype == torch.bfloat16 and c.max_position_embeddings == 256
    assert not (c.attention_bias or c.o_proj_bias or c.mlp_bias or c.tie_word_embeddings)
    assert c.rope_theta == 10000.0 and c.rope_scaling is None
    assert c.sliding_window is None and c.eos_token_ids == (2,)


def test_llama_biases_and_explicit_head_dim(tmp_path):
    save_tiny_model(tmp_path, "llama", attention_bias=True, mlp_bias=True, head_dim=32,
                    tie_word_embeddings=True)  # fmt: skip
    c = load_model_config(tmp_path)
    assert c.attention_bias and c.o_proj_bias and c.mlp_bias and c.tie_word_embeddings
    assert c.head_dim == 32 and c.torch_dtype == torch.float32


def test_mistral_records_its_window_on_every_layer(tmp_path):
    save_tiny_model(tmp_path, "mistral", sliding_window=32)
    c = load_model_config(tmp_path)
    assert c.architecture == "MistralForCausalLM" and not c.attention_bias
    assert c.sliding_window == 32 and c.sliding_window_layers == (0, 1)


def test_qwen2_has_qkv_bias_and_uses_its_window_only_when_asked(tmp_path):
    save_tiny_model(tmp_path / "off", "qwen2", sliding_window=32)
    off = load_model_config(tmp_path / "off")
    assert off.attention_bias and not off.o_proj_bias and off.sliding_window is None
    save_tiny_model(tmp_path / "on", "qwen2", use_sliding_window=True, sliding_window=32,
                    max_window_layers=1)  # fmt: skip
    on = load_model_config(tmp_path / "on")
    assert on.sliding_window == 32 and on.sliding_window_layers == (1,)
    # the transformers 4 layout has no layer_types: layers from max_window_layers on slide
    raw = {**V4_BASE, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
           "sliding_window": 16, "max_window_layers": 1}  # fmt: skip
    assert load_model_config(write_config(tmp_path / "v4", raw)).sliding_window_layers == (1,)


def test_qwen3_norms_q_and_k_and_its_attention_bias_covers_o(tmp_path):
    raw = {**V4_BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32,
           "sliding_window": 32}  # fmt: skip
    plain = load_model_config(write_config(tmp_path / "plain", raw))
    assert plain.qk_norm and plain.head_dim == 32
    assert not (plain.attention_bias or plain.o_proj_bias) and plain.sliding_window is None
    biased = load_model_config(write_config(tmp_path / "b", {**raw, "attention_bias": True}))
    assert biased.attention_bias and biased.o_proj_bias and not biased.mlp_bias
    llama = load_model_config(write_config(tmp_path / "l", V4_BASE))
    assert not llama.qk_norm


def test_phi3_stores_its_linears_fused_and_slides_on_every_layer(tmp_path):
    raw = {**V4_BASE, "architectures": ["Phi3ForCausalLM"], "sliding_window": 64}
    c = load_model_config(write_config(tmp_path, raw))
    assert c.fused_linears and not (c.qk_norm or c.attention_bias)
    assert c.sliding_window == 64 and c.sliding_window_layers == (0, 1)
    partial = {**raw, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}}
    with pytest.raises(ModelLoadError, match="partial_rotary_factor"):
        load_model_config(write_config(tmp_path / "p", partial))


def test_gemma3_in_either_layout(tmp_path):
    v4 = {**V4_BASE, "architectures": ["Gemma3ForCausalLM"], "head_dim": 32,
          "num_hidden_layers": 7, "sliding_window": 512, "sliding_window_pattern": 6,
          "rope_theta": 1e6, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 64,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}  # fmt: skip
    c = load_model_config(write_config(tmp_path / "v4", v4))
    assert c.sliding_window == 512 and c.sliding_window_layers == (0, 1, 2, 3, 4, 6)
    assert (c.rope_theta, c.local_rope_theta) == (1e6, 10000.0)
    assert c.rope_scaling == RopeScaling("linear", 8.0)
    assert c.norm_offset == 1.0 and c.sandwich_norms and c.qk_norm and c.activation == "gelu_tanh"
    assert c.embed_scale == 64**0.5 and c.attn_scale == 64**-0.5
    save_tiny("gemma3", tmp_path / "v5")  # transformers 5's RoPE per layer type
    v5 = load_model_config(tmp_path / "v5")
    assert (v5.rope_theta, v5.local_rope_theta) == (1e6, 10000.0)
    assert v5.rope_scaling == RopeScaling("linear", 4.0)
    assert v5.sliding_window == 5 and v5.sliding_window_layers == (0, 1, 2)
    assert v5.final_logit_softcap == 1.0


def test_gemma2_caps_its_attention_scores_and_slides_on_even_layers(tmp_path):
    raw = {**V4_BASE, "architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 4,
           "sliding_window": 64, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16}  # fmt: skip
    c = load_model_config(write_config(tmp_path / "g2", raw))
    assert (c.attn_softcap, c.final_logit_softcap) == (50.0, 30.0)
    assert c.sliding_window_layers == (0, 2) and not c.qk_norm and c.local_rope_theta is None
    g3 = {**raw, "architectures": ["Gemma3ForCausalLM"]}
    with pytest.raises(ModelLoadError, match="attention logit soft-capping"):
        load_model_config(write_config(tmp_path / "g3", g3))


def test_eos_ids_prefer_generation_config(tmp_path):
    save_tiny_model(tmp_path, "llama", eos_token_id=2)
    save_generation_config(tmp_path, [2, 7, 9])
    assert load_model_config(tmp_path).eos_token_ids == (2, 7, 9)
    assert load_model_config(write_config(tmp_path / "none", {**V4_BASE, "eos_token_id": None}))\
        .eos_token_ids == ()  # fmt: skip


@pytest.mark.parametrize("name", sorted(V4_ROPE))
def test_transformers4_layout_reads_as_its_transformers5_resave(tmp_path, name):
    v4 = write_config(tmp_path / "v4", {**V4_BASE, **V4_ROPE[name]})
    AutoConfig.from_pretrained(v4).save_pretrained(tmp_path / "v5")  # rewrites rope_parameters
    assert "rope_parameters" in (tmp_path / "v5" / "config.json").read_text()
    old, new = load_model_config(v4), load_model_config(tmp_path / "v5")
    assert old == new
    assert old.torch_dtype == torch.bfloat16 and old.rms_norm_eps == 1e-5


def test_llama3_and_yarn_fields(tmp_path):
    c = load_model_config(write_config(tmp_path / "a", {**V4_BASE, **V4_ROPE["llama3"]}))
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    y = load_model_config(write_config(tmp_path / "b", {**V4_BASE, **V4_ROPE["yarn"]}))
    assert y.rope_scaling.type == "yarn" and y.rope_scaling.original_max_position_embeddings == 64
    assert y.rope_scaling.attention_factor == pytest.approx(0.1 * torch.tensor(4.0).log() + 1)
    # llama3 without original_max_position_embeddings falls back to max_position_embeddings
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    c = load_model_config(write_config(tmp_path / "c", {**V4_BASE, "rope_scaling": rope}))
    assert c.rope_scaling.original_max_position_embeddings == TINY["max_position_embeddings"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel is not supported; supported: "
         "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
         "Qwen3MoeForCausalLM, "
         "Phi3ForCausalLM, Gemma2ForCausalLM"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs 'low_freq_factor'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_attention_heads": None}, "num_attention_heads must be a positive integer, got "
         "missing"),
        ({"num_key_value_heads": 3}, "not a multiple of 3"),
        ({"torch_dtype": "int8"}, "dtype 'int8'"),
    ],
)  # fmt: skip
def test_refusals_are_one_clear_line(tmp_path, change, message):
    write_config(tmp_path, {**V4_BASE, **change})
    with pytest.raises(ModelLoadError, match=re.escape(message)) as err:
        load_model_config(tmp_path)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_missing_or_broken_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"config\.json not found"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model_config(tmp_path)
