"""The grouped mixture-of-experts linear with per-row LoRA, and its one dispatch point.

Rows come sorted by (expert, adapter slot) (kernels/expert_groups.py). For each group g of
rows, with expert e, slot s and rank r:

    y[rows] = x[rows] @ W[e].T                                      (W[e] * w_scale[e][:, None] if FP8)
            + scales[s] * (x[rows] @ A_i[e, s, :r].T) @ B_i[e, s, :r]   into slice i's columns

A_i is [E, num_slots, max_rank, in] and B_i [E, num_slots, max_rank, out_i] (B stored
transposed, as in kernels/lora_ops.py), one per fused slice (gate|up); slice i owns columns
[sum(out_0..out_{i-1}), +out_i) of y. The stacks may be overlapping paged views: every
backend reads them by their strides, rows [:r] of a slot only.

On CUDA one Triton kernel computes it (kernels/expert_linear_triton.py); elsewhere torch,
one matmul per run of an expert's rows and one shrink and expand per (expert, slot) group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.expert_groups import ExpertGroups
from kernels.fp8 import FP8_DTYPE, dequantize_fp8
from kernels.lora_checks import (
    ACTIVATION_DTYPES,
    as_slices,
    check_shape,
    check_stacks,
    check_tensor,
)

Stacks = torch.Tensor | Sequence[torch.Tensor] | None


def expert_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    w_scale: torch.Tensor | None,
    lora_a: Stacks,
    lora_b: Stacks,
    scales: torch.Tensor | None,
    groups: ExpertGroups,
    checked: bool = False,
) -> torch.Tensor:
    """y [N, out] = each group's expert linear plus its adapter's LoRA update, in x's dtype.

    x: [N, in], rows sorted as groups says; weight: [E, out, in] in x's dtype, or
    float8_e4m3fn with w_scale [E, out] float32 (else None); lora_a, lora_b: a stack or a
    tuple of stacks (one per slice) [E, num_slots, max_rank, in] / [..., out_i], or both
    None (base only); scales: [num_slots] float32 (None without LoRA).
    checked: validate every argument first (a ValueError naming it); callers that built
    the arguments themselves skip it.
    """
    a = None if lora_a is None else as_slices("lora_a", lora_a)
    b = None if lora_b is None else as_slices("lora_b", lora_b)
    if checked:
        check_expert_linear(x, weight, w_scale, a, b, scales, groups)
    if x.is_cuda:
        from kernels.expert_linear_triton import expert_linear_triton

        return expert_linear_triton(x, weight, w_scale, a, b, scales, groups)
    return expert_linear_torch(x, weight, w_scale, a, b, scales, groups)


def expert_linear_torch(x, weight, w_scale, lora_a, lora_b, scales, groups: ExpertGroups):
    """expert_linear in torch, looping over the host groups; lora_a, lora_b tuples or None."""
    y = x.new_empty(x.shape[0], weight.shape[1])
    for expert, lo, hi in _expert_runs(groups):
        w = weight[expert]  # [out, in]
        if w_scale is not None:
            w = dequantize_fp8(w, w_scale[expert], x.dtype)
        torch.mm(x[lo:hi], w.T, out=y[lo:hi])
    if lora_a is None:
        return y
    columns, col = [], 0
    for bs in lora_b:
        columns.append(slice(col, col + bs.shape[3]))
        col += bs.shape[3]
    host_scales = None
    for e, s, start, length, r in zip(groups.host_experts, groups.host_slots, groups.host_starts,
                                       groups.host_lengths, groups.host_ranks):  # fmt: skip
        if s < 0 or r == 0 or length == 0:
            continue
        if host_scales is None:
            host_scales = scales.tolist()  # once, and only when some group has an adapter
        rows = slice(start, start + length)
        for a_i, b_i, cols in zip(lora_a, lora_b, columns):
            t = x[rows] @ a_i[e, s, :r].T  # [length, r]: rows [:r] of the slot, a strided view
            # The sum over the rank in float32 inside addmm, added to the base once.
            y[rows, cols].addmm_(t, b_i[e, s, :r], alpha=host_scales[s])
    return y


def _expert_runs(groups: ExpertGroups):
    """(expert, first row, end row) of each run of adjacent groups of one expert."""
    runs: list[list[int]] = []
    for e, start, length in zip(groups.host_experts, groups.host_starts, groups.host_lengths):
        if length == 0:
            continue
        if runs and runs[-1][0] == e and runs[-1][2] == start:
            runs[-1][2] = start + length
        else:
            runs.append([e, start, start + length])
    return runs


def check_expert_linear(x, weight, w_scale, lora_a, lora_b, scales, groups) -> None:
    """Every argument of expert_linear (lora_a, lora_b as tuples or None): a ValueError
    naming the first bad one."""
    check_tensor("x", x, dim=2, dtypes=ACTIVATION_DTYPES)
    num_rows, in_features = x.shape
    check_tensor("weight", weight, dim=3, dtypes=(x.dtype, FP8_DTYPE), device=x.device)
    num_experts, out_features, _ = weight.shape
    if weight.shape[2] != in_features:
        raise ValueError(f"weight: expected in = {in_features} (from x), got {weight.shape[2]}")
    if num_experts < 1:
        raise ValueError("weight: expected at least one expert")
    if weight.dtype == FP8_DTYPE:
        check_tensor("w_scale", w_scale, dim=2, dtypes=(torch.float32,), device=x.device)
        check_shape("w_scale", w_scale, (num_experts, out_features))
    elif w_scale is not None:
        raise ValueError(f"w_scale: expected None for a {weight.dtype} weight (FP8 only)")
    shape = _check_lora(x, lora_a, lora_b, scales, num_experts, out_features)
    _check_groups(groups, num_rows, num_experts, shape, x.device)


def _check_lora(x, lora_a, lora_b, scales, num_experts, out_features) -> tuple[int, int] | None:
    """The stacks and scales; returns their (num_slots, max_rank) (None without LoRA)."""
    if (lora_a is None) != (lora_b is None):
        name = "lora_b" if lora_a is not None else "lora_a"
        raise ValueError(f"{name}: expected lora_a and lora_b both given or both None")
    if lora_a is None:
        return None
    if len(lora_a) != len(lora_b):
        raise ValueError(f"lora_b: expected {len(lora_a)} slices like lora_a, got {len(lora_b)}")
    for name, stacks in (("lora_a", lora_a), ("lora_b", lora_b)):
        for i, s in enumerate(stacks):
            label = name if len(stacks) == 1 else f"{name}[{i}]"
            check_tensor(label, s, dim=4, dtypes=(x.dtype,), device=x.device)
            if s.shape[0] != num_experts:
                raise ValueError(f"{label}: expected {num_experts} experts, got {s.shape[0]}")
            if name == "lora_a" and s.shape[3] != x.shape[1]:
                raise ValueError(f"{label}: expected in = {x.shape[1]} (from x), got {s.shape[3]}")
        # Each expert's [num_slots, max_rank, dim] stack as lora_ops takes it: dense rows,
        # slots a whole number of rows apart, the same in every slice.
        check_stacks(name, tuple(s[0] for s in stacks), dtype=x.dtype, device=x.device)
        # The kernel steps between experts by a row count shared by the slices (one expert:
        # never steps).
        rows = {divmod(s.stride(0), s.stride(2)) for s in stacks}
        if num_experts > 1 and (len(rows) != 1 or next(iter(rows))[1] != 0):
            raise ValueError(
                f"{name}: expected experts a whole number of rows apart, the same in every "
                f"slice, got strides {[tuple(s.stride()) for s in stacks]}"
            )
    if lora_a[0].shape[1:3] != lora_b[0].shape[1:3]:
        raise ValueError(
            f"lora_b: expected [num_slots, max_rank] = {tuple(lora_a[0].shape[1:3])} like "
            f"lora_a, got {tuple(lora_b[0].shape[1:3])}"
        )
    total = sum(s.shape[3] for s in lora_b)
    if total != out_features:
        raise ValueError(
            f"lora_b: expected slice widths summing to out = {out_features}, got {total}"
        )
    num_slots, max_rank = lora_a[0].shape[1:3]
    check_tensor("scales", scales, dim=1, dtypes=(torch.float32,), device=x.device)
    check_shape("scales", scales, (num_slots,))
    return num_slots, max_rank


def _check_groups(groups, num_rows, num_experts, stacks_shape, device) -> None:
    """groups partition the N rows in order, within the experts, and the slots and ranks
    of the stacks (stacks_shape: their (num_slots, max_rank); None without LoRA)."""
    if not isinstance(groups, ExpertGroups):
        raise ValueError(
            f"groups: expected ExpertGroups from group_routes, got {type(groups).__name__}"
        )
    if groups.num_rows != num_rows:
        raise ValueError(f"groups: built for {groups.num_rows} rows, but x has {num_rows}")
    if groups.experts.device != device:
        raise ValueError(f"groups: expected tensors on {device}, got {groups.experts.device}")
    num_slots, max_rank = stacks_shape or (None, None)
    row = 0
    for g, (e, s, start, length, r) in enumerate(zip(groups.host_experts, groups.host_slots,
            groups.host_starts, groups.host_lengths, groups.host_ranks)):  # fmt: skip
        # y is written only where a group says: the groups must cover every row, once.
        if start != row or length < 0:
            raise ValueError(
                f"groups: group {g} covers rows [{start}, +{length}), expected the next "
                f"rows from {row}"
            )
        row += length
        if not 0 <= e < num_experts:
            raise ValueError(f"groups: group {g} has expert {e}, expected 0..{num_experts - 1}")
        if s < -1 or (num_slots is not None and s >= num_slots):
            raise ValueError(f"groups: group {g} has slot {s}, expected -1 or 0..{num_slots - 1}")
        if max_rank is not None and s >= 0 and not 0 <= r <= max_rank:
            raise ValueError(
                f"groups: group {g} has rank {r}, expected 0..{max_rank} (the stacks' max_rank)"
            )
    if row != num_rows:
        raise ValueError(f"groups: cover {row} rows, but x has {num_rows}")
