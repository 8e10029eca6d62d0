"""Gemma configs as they are published: Gemma 2's with its hidden_act beside
hidden_activation, Gemma 3 multimodal text_configs written sparsely over transformers'
defaults, and the malformed ones refused by name; and Gemma's (1 + w) norm in bfloat16 as
transformers computes it."""

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

from adapters.format.base_model import BaseModelSpec
from serving.model.errors import ModelLoadError
from serving.model.hf_config import load_model_config
from serving.model.linear import rms_norm
from tests.serving.model.hf_folders import write_config

GEMMA2_HUB = {  # google/gemma-2-2b's config.json, as published
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
    "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "torch_dtype": "float32", "eos_token_id": [1, 107],
}  # fmt: skip
GEMMA3_12B = {  # google/gemma-3-12b-it's config.json: text_config holds only what differs
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                    "num_attention_heads": 16, "num_hidden_layers": 48,
                    "num_key_value_heads": 8, "rope_scaling": {"factor": 8.0,
                                                               "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"model_type": "siglip_vision_model"},
}  # fmt: skip


def test_a_published_gemma2_config_loads(tmp_path):
    c = load_model_config(write_config(tmp_path, GEMMA2_HUB))
    assert (c.attn_softcap, c.final_logit_softcap, c.activation) == (50.0, 30.0, "gelu_tanh")
    assert c.sliding_window_layers == tuple(range(0, 26, 2))


def test_gemma2_soft_caps_default_as_transformers_does(tmp_path):
    raw = {k: v for k, v in GEMMA2_HUB.items() if not k.endswith("softcapping")}
    c = load_model_config(write_config(tmp_path, raw))
    assert (c.attn_softcap, c.final_logit_softcap) == (50.0, 30.0)


def test_a_sparse_multimodal_text_config_takes_transformers_defaults(tmp_path):
    c = load_model_config(write_config(tmp_path, GEMMA3_12B))
    assert (c.head_dim, c.vocab_size, c.rope_theta, c.local_rope_theta) == (
        256, 262208, 1e6, 10000.0)  # fmt: skip
    assert c.attn_scale == 256**-0.5 and c.sliding_window == 1024
    assert c.max_position_embeddings == 131072 and c.num_layers == 48
    assert c.sliding_window_layers == tuple(i for i in range(48) if (i + 1) % 6)
    assert c.final_logit_softcap is None and c.text_prefixes
    spec = BaseModelSpec.from_config(GEMMA3_12B)  # adapters are checked against the same model
    assert spec.shapes["q_proj"] == (3840, 16 * 256) and spec.vocab_size == 262208


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types must list each of the 26"),
        ({"layer_types": ["chunked_attention"] * 26}, "layer_types 'chunked_attention'"),
        ({"architectures": ["Gemma3ForCausalLM"], "sliding_window_pattern": 0},
         "sliding_window_pattern must be a positive integer"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"hidden_activation": "relu", "hidden_act": "relu"}, "hidden_activation 'relu'"),
    ],
)  # fmt: skip
def test_malformed_gemma_configs_are_refused_by_name(tmp_path, change, message):
    raw = {**GEMMA2_HUB, **change}
    if "sliding_window_pattern" in change:  # Gemma 3 allows no attention soft-cap
        raw.pop("attn_logit_softcapping")
    with pytest.raises(ModelLoadError, match=message):
        load_model_config(write_config(tmp_path, raw))


def test_the_one_plus_w_norm_rounds_once_in_bfloat16_as_transformers():
    torch.manual_seed(0)
    hf = Gemma3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(64) * 0.3)
    x = torch.randn(128, 64).to(torch.bfloat16)
    ours = rms_norm(x, hf.weight.float() + 1.0, 1e-6)  # as CheckpointWeights.norm keeps it
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, hf(x))
