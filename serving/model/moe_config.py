"""Qwen3-MoE's own config fields, read into ModelConfig's (serving.model.hf_config).

Qwen3-MoE is Qwen3's decoder with each layer's MLP replaced by a sparse block: a router
(`mlp.gate`, [num_experts, hidden], no bias) scores the experts, a softmax in float32 over all
of them, the top `num_experts_per_tok` kept (renormalized to sum 1 with `norm_topk_prob`),
and each kept expert's SwiGLU MLP (`moe_intermediate_size` wide) adds its output times its
weight. Checkpoints whose layers mix dense and sparse MLPs (`mlp_only_layers`,
`decoder_sparse_step` above 1) and shared experts are refused by name.
"""

from __future__ import annotations

from typing import Any

from serving.model.errors import ModelLoadError

MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM",)


def moe_fields(raw: dict[str, Any], where: str) -> dict:
    """ModelConfig's fields that a sparse-MLP model sets, from its config.json (raw)."""
    if raw.get("mlp_only_layers"):
        raise ModelLoadError(
            f"{where}: mlp_only_layers {raw['mlp_only_layers']!r}: layers with a dense MLP "
            "among sparse ones are not supported (every layer must be sparse)"
        )
    step = raw.get("decoder_sparse_step", 1)
    if step != 1:
        raise ModelLoadError(
            f"{where}: decoder_sparse_step {step!r}: only every layer sparse (1) is supported"
        )
    if raw.get("shared_expert_intermediate_size"):
        raise ModelLoadError(f"{where}: shared experts (shared_expert_intermediate_size) "
                             "are not supported")  # fmt: skip
    if "num_experts" not in raw and "num_local_experts" in raw:  # transformers 5 writes it so
        raw = {**raw, "num_experts": raw["num_local_experts"]}
    fields = {}
    for key, name in (
        ("num_experts", "num_experts"),
        ("num_experts_per_tok", "experts_per_token"),
        ("moe_intermediate_size", "moe_intermediate_size"),
    ):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            shown = "missing" if value is None else repr(value)
            raise ModelLoadError(f"{where}: {key} must be a positive integer, got {shown}")
        fields[name] = value
    if fields["experts_per_token"] > fields["num_experts"]:
        raise ModelLoadError(
            f"{where}: num_experts_per_tok {fields['experts_per_token']} exceeds "
            f"num_experts {fields['num_experts']}"
        )
    fields["norm_topk_prob"] = bool(raw.get("norm_topk_prob", False))
    return fields
