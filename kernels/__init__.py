"""Compute kernels: segmented-gather LoRA ops, FP8 and prepacked CPU linears, paged attention. Imports nothing else of loraserve."""

from kernels.attention_plan import AttentionPlan, paged_attention_planned, write_kv_planned
from kernels.cpu_gemm import pack_weight, packed_linear, packed_shapes
from kernels.device_tables import upload
from kernels.expert_groups import ExpertGroups, group_routes, route_groups
from kernels.expert_linear import expert_linear
from kernels.fp8 import dequantize_fp8, fp8_linear, quantize_fp8
from kernels.fp8_block import dequantize_fp8_blocks, fp8_block_linear, quantize_fp8_blocks
from kernels.lora_native import available as cpu_lora_kernel_ready
from kernels.lora_ops import (
    lora_apply_planned,
    lora_expand,
    lora_expand_planned,
    lora_shrink,
    lora_shrink_planned,
)
from kernels.lora_rows import dora_rescale, lora_bias_add
from kernels.paged_attention import (
    HostIndex,
    check_paged_attention,
    check_write_kv,
    checked_plan,
    paged_attention,
    write_kv,
)
from kernels.segments import Segments, build_segments

__all__ = [
    "AttentionPlan",
    "ExpertGroups",
    "HostIndex",
    "Segments",
    "build_segments",
    "check_paged_attention",
    "check_write_kv",
    "checked_plan",
    "cpu_lora_kernel_ready",
    "dequantize_fp8",
    "dequantize_fp8_blocks",
    "dora_rescale",
    "expert_linear",
    "fp8_block_linear",
    "fp8_linear",
    "group_routes",
    "lora_apply_planned",
    "lora_bias_add",
    "lora_expand",
    "lora_expand_planned",
    "lora_shrink",
    "lora_shrink_planned",
    "pack_weight",
    "packed_linear",
    "packed_shapes",
    "paged_attention",
    "paged_attention_planned",
    "quantize_fp8",
    "quantize_fp8_blocks",
    "route_groups",
    "upload",
    "write_kv",
    "write_kv_planned",
]
