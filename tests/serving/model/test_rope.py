"""RoPE against transformers: frequencies, cos/sin and rotated q/k, bit for bit in float32."""

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from serving.model.hf_config import load_model_config
from serving.model.rope import apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq
from tests.serving.model.hf_folders import save_tiny_model, write_config
from tests.serving.model.test_hf_config import V4_BASE

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
SCALINGS = {
    "plain": None,
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": LLAMA3,
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
             "rope_theta": 1e6},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                    "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 16, "truncate": False,
                    "rope_theta": 1e6},
}  # fmt: skip


def _pair(tmp_path, scaling, head_dim=32):
    """(ours, transformers') configs of one tiny Llama saved by transformers."""
    save_tiny_model(tmp_path, "llama", rope_parameters=scaling, head_dim=head_dim)
    return load_model_config(tmp_path), AutoConfig.from_pretrained(tmp_path)


def _hf_inv_freq(hf, seq_len=None):
    rope_type = hf.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    return ROPE_INIT_FUNCTIONS[rope_type](hf, None, seq_len=seq_len)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_inv_freq_and_attention_factor_match_transformers(tmp_path, name):
    ours, hf = _pair(tmp_path, SCALINGS[name])
    ref, attention = _hf_inv_freq(hf)
    got = rope_inv_freq(ours)
    assert got.shape == (16,) and got.dtype == torch.float32
    assert torch.equal(got, ref)
    assert rope_attention_factor(ours) == pytest.approx(attention, rel=1e-12)


def test_dynamic_ntk_grows_theta_past_the_context(tmp_path):
    ours, hf = _pair(tmp_path, SCALINGS["dynamic"])
    assert torch.equal(rope_inv_freq(ours, seq_len=100), rope_inv_freq(ours))  # within 256
    for seq_len in (257, 1000):
        assert torch.equal(rope_inv_freq(ours, seq_len), _hf_inv_freq(hf, seq_len)[0])
    assert not torch.equal(rope_inv_freq(ours, 1000), rope_inv_freq(ours))


def test_transformers4_llama3_layout_gives_the_same_frequencies(tmp_path):
    rope = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    v4 = write_config(tmp_path, {**V4_BASE, "rope_theta": 500000.0, "rope_scaling": rope})
    ref, _ = _hf_inv_freq(AutoConfig.from_pretrained(v4))
    assert torch.equal(rope_inv_freq(load_model_config(v4)), ref)


@pytest.mark.parametrize("name", ["plain", "linear", "llama3", "yarn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_and_rotation_match_transformers(tmp_path, name, dtype):
    ours, hf = _pair(tmp_path, SCALINGS[name])
    module = LlamaRotaryEmbedding(hf)
    gen = torch.Generator().manual_seed(0)
    num_tokens, num_heads, head_dim = 37, 4, 32
    positions = torch.randint(0, 300, (num_tokens,), generator=gen)  # past the context too
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)  # [T, H, D]
    k = torch.randn(num_tokens, 2, head_dim, generator=gen).to(dtype)

    cos, sin = rope_cos_sin(rope_inv_freq(ours), positions, rope_attention_factor(ours))
    assert cos.shape == sin.shape == (num_tokens, head_dim) and cos.dtype == torch.float32
    ref_cos, ref_sin = module(q, positions[None])  # [1, T, D] in q's dtype
    assert torch.equal(cos.to(dtype), ref_cos[0]) and torch.equal(sin.to(dtype), ref_sin[0])

    # transformers' layout is [B, H, T, D]; ours is the flat [T, H, D]
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                        ref_cos, ref_sin)  # fmt: skip
    assert torch.equal(apply_rope(q, cos, sin), ref_q[0].transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, sin), ref_k[0].transpose(0, 1))


def test_rotation_is_relative(tmp_path):
    """<rope(q, m), rope(k, n)> depends only on m - n: the property RoPE exists for."""
    ours, _ = _pair(tmp_path, None)
    inv_freq = rope_inv_freq(ours)
    q, k = torch.randn(1, 1, 32, dtype=torch.float64), torch.randn(1, 1, 32, dtype=torch.float64)

    def score(m, n):
        cq, sq = rope_cos_sin(inv_freq.double(), torch.tensor([m]))
        ck, sk = rope_cos_sin(inv_freq.double(), torch.tensor([n]))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    assert score(7, 3) == pytest.approx(score(104, 100).item(), rel=1e-5)
    assert score(0, 0) == pytest.approx((q * k).sum().item(), rel=1e-6)
