"""A mixture-of-experts LoRA as one LoRA per expert projection, whichever layout PEFT wrote.

Two layouts reach us:

    per expert   ...mlp.experts.{e}.gate_proj.lora_A.weight [r, in]  (experts as nn.Linear:
                 transformers 4, and vLLM's layout): already one module per expert
    stacked      ...mlp.experts.lora_A.weight [r * E, in], lora_B.weight [out, r * E]
                 (transformers 5 stores each projection of all experts as one parameter,
                 [E, out, in], and PEFT's target_parameters wraps it: peft ParamWrapper)

In the stacked layout expert e's A is rows [e * r, (e + 1) * r) of lora_A (expert-major),
but its B is columns e, e + E, e + 2E, ... of lora_B (rank-major): PEFT reshapes B to
[out, r, E]. Expert e's delta is scale * B[:, :, e] @ A[e]. gate_up_proj's rows are
[gate; up], so its LoRA splits like Phi-3's fused gate_up_proj: a shared A, B's rows apart.
Two parameters of one module nest, and PEFT names the inner one `experts.base_layer`; which
is which follows its sort, so each is told apart by its shapes here, never by its name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adapters.errors import AdapterError
from adapters.format.base_model import BaseModelSpec, expert_module
from adapters.format.peft_config import LoraConfig

STACKED = ("experts", "experts.base_layer")  # the module names of stacked expert LoRA
_PARAMS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def split_stacked(
    layer: int,
    module: str,
    model_name: str,
    found: Mapping[str, torch.Tensor],
    config: LoraConfig,
    base: BaseModelSpec | None,
    where: str,
) -> tuple[str | None, dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]]]:
    """(the parameter's target name, {(layer, experts.e.proj): (a [r, in], b [out, r],
    scale)}); the name is None, and nothing split, when target_parameters does not select it."""
    if base is None or not base.num_experts:
        raise AdapterError(
            f"{where}: stacked expert LoRA needs a mixture-of-experts base model to split it "
            "(--base MODEL_DIR)" if base is None else
            f"{where}: the base model has no experts (num_experts is not in its config)"
        )  # fmt: skip
    if layer >= base.num_layers:
        raise AdapterError(f"{where}: layer {layer} is out of range; the base model has "
                           f"{base.num_layers}")  # fmt: skip
    if module.count("base_layer") > 1:
        raise AdapterError(f"{where}: LoRA on more than two stacked parameters of one module "
                           "has no settled layout in PEFT; only gate_up_proj and down_proj")  # fmt: skip
    extra = sorted(set(found) - {"A", "B"})
    if extra:
        raise AdapterError(f"{where}: stacked expert LoRA takes lora_A and lora_B only (found "
                           f"{', '.join(extra)}): PEFT has no bias or DoRA on it")  # fmt: skip
    if "A" not in found or "B" not in found:
        raise AdapterError(
            f"{where}: has {'lora_A' if 'A' in found else 'lora_B'} without its pair"
        )
    a, b, experts = found["A"], found["B"], base.num_experts
    param = _parameter(a, b, base)
    if param is None:
        raise AdapterError(
            f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} fit neither "
            f"gate_up_proj nor down_proj of {experts} experts ([r * {experts}, in], [out, r * {experts}])"
        )
    key = f"{model_name.removesuffix('.base_layer')}.{param}"
    if not config.selects_parameter(key):
        return None, {}
    rank = a.shape[0] // experts
    wanted = config.rank_of(key)
    if rank != wanted:
        raise AdapterError(f"{where}: {param}'s LoRA has rank {rank} per expert; "
                           f"the config says {wanted}")  # fmt: skip
    per_a = a.reshape(experts, rank, a.shape[1])  # [E, r, in]: expert-major rows
    per_b = b.reshape(b.shape[0], rank, experts)  # [out, r, E]: rank-major columns
    scale, out, start = config.scale_of(key), {}, 0
    for part in _PARAMS[param]:
        rows = base.shapes[expert_module(0, part)][1]
        for e in range(experts):
            out[layer, expert_module(e, part)] = (
                per_a[e], per_b[start : start + rows, :, e], scale
            )  # fmt: skip
        start += rows
    return param, out


def _parameter(a: torch.Tensor, b: torch.Tensor, base: BaseModelSpec) -> str | None:
    """Which stacked parameter lora_A [r * E, in] and lora_B [out, r * E] fit, by shape."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
        return None
    if a.shape[0] == 0 or a.shape[0] % base.num_experts:
        return None
    for param, parts in _PARAMS.items():
        fan_in = base.shapes[expert_module(0, parts[0])][0]
        fan_out = sum(base.shapes[expert_module(0, p)][1] for p in parts)
        if (a.shape[1], b.shape[0]) == (fan_in, fan_out):
            return param
    return None
