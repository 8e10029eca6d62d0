"""A multimodal checkpoint (Gemma 3 4B and up) as its language model: the one place that
says how to read its config and which of its tensors are the language model's.

Its config.json holds the text model's settings in `text_config`, written sparsely:
published Gemma 3 configs leave out what equals Gemma3TextConfig's defaults (the 12B has no
vocab_size, head_dim or rope_theta there), so those defaults fill the gaps. Its tensors are
the language model's under a prefix, beside the vision tower's.
"""

from __future__ import annotations

MULTIMODAL = ("Gemma3ForConditionalGeneration",)
# transformers' Gemma3TextConfig defaults, which published text_configs leave out
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
}  # fmt: skip
# (checkpoint prefix, the text model's) of its language model, as transformers 4 and 5 write
TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))  # fmt: skip
# the rest: its image side, which is not served (nor LoRA on it)
VISION_PARTS = ("vision_tower.", "multi_modal_projector.")


def is_multimodal(config: dict) -> bool:
    """Whether config.json is a multimodal checkpoint's."""
    return (config.get("architectures") or [None])[0] in MULTIMODAL


def text_model_config(config: dict) -> dict:
    """config.json of a multimodal checkpoint as its text model's (Gemma3ForCausalLM): its
    text_config over the defaults, with the top level's dtype; ValueError without one."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{config['architectures'][0]} config.json has no text_config object")
    top = {k: config[k] for k in ("dtype", "torch_dtype") if k in config}
    given = {k: v for k, v in text.items() if v is not None}
    return {**GEMMA3_TEXT_DEFAULTS, **top, **given, "architectures": ["Gemma3ForCausalLM"]}
