"""A sparse MLP (Qwen3-MoE's): a router picks each token's experts, and each row's adapter
follows its tokens into the experts they reach.

    router    logits = x @ R.T  [T, E]  (with the row's LoRA on `gate` where it has one)
    route     p = softmax(logits) in float32; the top k of p per token, renormalized to sum
              1 with norm_topk_prob, then in the model's dtype (as transformers does)
    experts   the T * k (token, expert) rows sorted by (expert, adapter slot); each expert's
              SwiGLU MLP over its rows, its LoRA per (expert, slot) group, in two grouped
              launches (kernels/expert_linear.py): gate|up, then down
    combine   out[t] = sum over t's experts of weight * expert output

A token whose adapter changes attention reaches other experts than the base's would: the
routing is computed per row from that row's own hidden state, so no row sees another's.
The rows are sorted by (expert, slot) on the device; only the groups' keys and sizes are read
back, once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.format.base_model import ROUTER
from kernels import expert_linear, quantize_fp8, route_groups
from serving.model.checkpoint_weights import CheckpointWeights
from serving.model.errors import ModelLoadError
from serving.model.linear import Linear, StepLora, lora_linear
from serving.model.step_lora import layer_stacks

PROJS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ExpertWeights:
    """One layer's router and experts: gate|up [E, 2 I, hidden], down [E, hidden, I], in the
    model's dtype, or float8_e4m3fn with per-row scales [E, rows] float32."""

    router: Linear  # [E, hidden], never quantized: the routing decides which weights run
    gate_up: torch.Tensor
    gate_up_scale: torch.Tensor | None
    down: torch.Tensor
    down_scale: torch.Tensor | None

    def served_weight(self, expert: int, proj: str) -> torch.Tensor:
        """W [out, in] float32 of expert's proj as computed with (FP8 dequantized)."""
        inter = self.down.shape[2]
        if proj == "down_proj":
            w, scale, rows = self.down[expert], self.down_scale, slice(None)
        else:
            rows = slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)
            w, scale = self.gate_up[expert, rows], self.gate_up_scale
        w = w.to(torch.float32)
        return w if scale is None else w * scale[expert, rows, None]


def load_experts(get: CheckpointWeights, prefix: str, config, fp8: bool) -> ExpertWeights:
    """The router and experts under prefix (model.layers.3.mlp.), stored one expert per
    linear (experts.{e}.gate_proj.weight, as published, FP8 with weight_scale as
    `loraserve quantize` writes them) or stacked (experts.gate_up_proj, transformers 5's).
    Per-expert tensors are removed from the state as they are stacked."""
    e, h, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
    router = Linear.make(get(f"{prefix}gate.weight", (e, h)), None, fp8=False)
    if f"{prefix}experts.gate_up_proj" in get.state:
        gate_up = get(f"{prefix}experts.gate_up_proj", (e, 2 * inter, h))
        down = get(f"{prefix}experts.down_proj", (e, h, inter))
        if not fp8:
            return ExpertWeights(router, gate_up, None, down, None)
        return ExpertWeights(router, *_quantized(gate_up), *_quantized(down))

    def stacked(projs: tuple[str, ...], shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        parts = [
            [get.linear(f"{prefix}experts.{i}.{proj}", shape, False) for proj in projs]
            for i in range(e)
        ]  # [E][projs]: each [rows, in]
        for i in range(e):  # stacked now: the per-expert tensors leave state, so a layer's
            for proj in projs:  # experts are never held twice (on a GPU, 2x the model)
                name = f"{prefix}experts.{i}.{proj}"
                for key in (f"{name}.weight", get.scale_name(name)):
                    get.state.pop(key, None)
        scaled = [p.scale is not None for row in parts for p in row]
        if any(scaled) and not all(scaled):
            raise ModelLoadError(f"checkpoint: {prefix}experts are stored some in FP8, some not")
        if any(p.block is not None for row in parts for p in row):
            raise ModelLoadError(f"checkpoint: {prefix}experts are FP8 with block-wise scales, "
                                 f"which experts do not take (per-row scales: compressed-tensors "
                                 f"channel or `loraserve quantize`)")  # fmt: skip
        if all(p.scale is not None for row in parts for p in row):  # pre-quantized: kept
            weight = torch.stack([torch.cat([p.weight.view(torch.uint8) for p in row])
                                  for row in parts]).view(parts[0][0].weight.dtype)  # fmt: skip
            return weight, torch.stack([torch.cat([p.scale for p in row]) for row in parts])
        weight = torch.stack([torch.cat([p.weight.to(get.dtype) for p in row]) for row in parts])
        return _quantized(weight) if fp8 else (weight, None)

    return ExpertWeights(
        router, *stacked(("gate_proj", "up_proj"), (inter, h)), *stacked(("down_proj",), (h, inter))
    )


def _quantized(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, in] as FP8 with a scale per expert row, [E, out]."""
    q, scale = quantize_fp8(w.reshape(-1, w.shape[2]))
    return q.view(w.shape), scale.view(w.shape[:2])


def sparse_mlp(
    x: torch.Tensor, w: ExpertWeights, layer: int, config, act, slab, lora: StepLora | None,
    slots: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """The sparse MLP's output [T, hidden] for x [T, hidden], each token under its own slot.

    slots: [T] the tokens' slab slots (-1: base only), or None with no adapter in the step.
    """
    k = config.experts_per_token
    served = lora is not None and slots is not None
    if served and (layer, ROUTER) in slab.keys:  # some adapter may adapt the router
        logits = lora_linear(x, w.router, layer_stacks(slab, layer, (ROUTER,), lora), lora)
    else:
        logits = w.router(x)  # [T, E]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, k, dim=-1)  # [T, k]
    if config.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    # rows n = t * k + j: token t's j-th expert, sorted by (expert, slot) on the device; a
    # slot with no expert LoRA in this layer groups as base only
    row_slots = slots.repeat_interleave(k) if served else None  # [N]
    ranks = slab.expert_host_ranks(layer) if served else ()
    order, groups = route_groups(experts.flatten(), row_slots, ranks)
    xs = x.index_select(0, order // k)  # [N, hidden]
    gate_up_lora = down_lora = (None, None)
    if groups.max_rank:
        (a_g, b_g), (a_u, b_u) = (slab.expert_stacks(layer, p) for p in PROJS[:2])
        gate_up_lora = ((a_g, a_u), (b_g, b_u))
        a_d, b_d = slab.expert_stacks(layer, "down_proj")
        down_lora = ((a_d,), (b_d,))
    scales = lora.scales if groups.max_rank else None
    checked = served and lora.checked
    gu = expert_linear(xs, w.gate_up, w.gate_up_scale, *gate_up_lora, scales, groups,
                       checked=checked)  # fmt: skip
    gate, up = gu.chunk(2, dim=-1)
    d = expert_linear(act(gate) * up, w.down, w.down_scale, *down_lora, scales, groups,
                      checked=checked)  # fmt: skip
    # Back in token order, then each token's k outputs summed in a fixed order: an atomic
    # scatter-add would sum them in whatever order the device runs it.
    unsorted = torch.empty_like(d)
    unsorted[order] = d  # [N, hidden], row t * k + j
    return (unsorted.view(-1, k, d.shape[1]) * weights[:, :, None]).sum(dim=1)
